from hostd import Sandbox

with Sandbox.create() as sbx:
    sbx.run("x = 1")
    a, b = sbx.fork(2)
    a.run("x += 1")
    sbx.merge(a)
    out = sbx.run("print(x)").stdout
    assert out == "2\n", out
    print(out.strip())
    b.delete()
