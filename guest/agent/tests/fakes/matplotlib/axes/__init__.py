class Axes:
    def __init__(self, figure):
        self.figure = figure
        figure.axes.append(self)

    def __repr__(self):
        return "<Axes: >"
