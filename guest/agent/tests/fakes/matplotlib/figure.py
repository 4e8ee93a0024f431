class Figure:
    def __init__(self, number):
        self.number = number
        self.axes = []

    def savefig(self, file, format=None, **options):
        file.write(b"PNG of figure %d as %s" % (self.number, format.encode()))

    def __repr__(self):
        return "<Figure size 640x480 with %d Axes>" % len(self.axes)
