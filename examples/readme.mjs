import { Sandbox } from '@hostd/sdk';

const sbx = await Sandbox.create();
await sbx.run('import math\nr = 2');
const [a, b] = await sbx.fork(2);
await a.run('r = r * 10');
await sbx.merge(a);
const { stdout } = await sbx.run('print(round(math.pi * r, 2))');
if (stdout !== '62.83\n') throw new Error(`unexpected output ${stdout}`);
console.log(stdout.trim());
await b.delete();
await sbx.delete();
