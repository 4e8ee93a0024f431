/** The virtio-serial port names the guest agent looks for (guest/PROTOCOL.md). */
export const AGENT_PORT_NAME = 'hostd.agent';
export const REPL_PORT_NAME = 'hostd.repl';
export const FILES_PORT_NAME = 'hostd.files';
export const NET_PORT_NAME = 'hostd.net';
export const PROC_PORT_NAME = 'hostd.proc';
