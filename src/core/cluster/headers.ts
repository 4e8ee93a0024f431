/**
 * The headers nodes put on their requests to each other. They live in core, which both the HTTP
 * API (api/forward.ts, api/routes/cluster.ts) and the cluster adapters (cluster/peer-http.ts)
 * may import without breaking the one-way imports (api -> core, cluster -> core), so that the
 * node that sends a header and the node that reads it spell it the same way.
 */

/**
 * On a request one node passes to another: the node that passed it. A request carrying it is
 * answered where it arrives and never forwarded again (at most one hop, even while two nodes'
 * views of the catalog disagree); the peer routes' calls carry it too.
 */
export const HOP_HEADER = 'x-hostd-forwarded-by';

/** The cluster's key (SERVICE_CLUSTER_KEY) on node-to-node calls (`/v1/cluster/peer/...`). */
export const CLUSTER_KEY_HEADER = 'x-hostd-cluster-key';
