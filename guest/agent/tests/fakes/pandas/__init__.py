"""A stand-in for pandas (see ../README.md): a DataFrame renders HTML and gives its columns
(to_dict(orient="list")), a Series does not."""

import datetime

NaT = type("NaTType", (), {"__repr__": lambda self: "NaT"})()


def Timestamp(text):
    return datetime.datetime.fromisoformat(text)   # pandas' is a datetime too


class DataFrame:
    def __init__(self, rows, columns=None):
        self.rows = rows
        self.columns = columns if columns is not None else list(range(len(rows[0])))

    @property
    def size(self):
        return len(self.rows) * len(self.columns)

    def to_dict(self, orient):
        assert orient == "list"
        return {c: [row[i] for row in self.rows] for i, c in enumerate(self.columns)}

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
