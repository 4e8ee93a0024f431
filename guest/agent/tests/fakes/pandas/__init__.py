"""A stand-in for pandas (see ../README.md): a DataFrame renders HTML, a Series does not."""


class DataFrame:
    def __init__(self, rows):
        self.rows = rows

    def _repr_html_(self):
        return "<table>%s</table>" % "".join(
            "<tr>%s</tr>" % "".join("<td>%s</td>" % v for v in row) for row in self.rows)

    def __repr__(self):
        return "\n".join(" ".join(str(v) for v in row) for row in self.rows)


class Series:
    def __init__(self, values):
        self.values = values

    def to_frame(self):
        return DataFrame([[v] for v in self.values])

    def __repr__(self):
        return "\n".join(str(v) for v in self.values)
