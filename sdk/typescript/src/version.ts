/**
 * The package's version, for what reports it at run time (the MCP handshake). A module rather
 * than a read of package.json, whose path differs where the sources are compiled into another
 * package (hostd's dist); a test keeps the two equal.
 */
export const SDK_VERSION = '0.1.0';
