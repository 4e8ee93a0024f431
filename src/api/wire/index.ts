/**
 * The wire contract: every request and response body of the native API, defined once here.
 * The server validates request bodies with these schemas (validate.ts), docs/openapi.json's
 * `components.schemas` is generated from them (scripts/gen-openapi.ts, checked in CI), and the
 * SDKs' types are generated from that file. A component's `$id` is its name in the file.
 */
import { idOf, type Component } from './schema.js';
import { ErrorBody } from './errors.js';
import {
  CreateRequest,
  Sandbox,
  SandboxId,
  SandboxInfo,
  SandboxList,
  SandboxState,
  TimeoutRequest,
} from './sandbox.js';
import { ExecEvent, ExecRequest, CellError } from './exec.js';
import { ForkRequest, ForkResponse, MergeResponse } from './lineage.js';
import { Snapshot, SnapshotList, SnapshotRequest } from './snapshots.js';
import { Template, TemplateList } from './templates.js';
import { FileEntry, FileWritten } from './files.js';
import { Context, ContextCreateRequest, ContextList } from './contexts.js';
import { ClusterInfo, ClusterNode, DrainReport } from './cluster.js';

export * from './errors.js';
export * from './sandbox.js';
export * from './exec.js';
export * from './lineage.js';
export * from './snapshots.js';
export * from './templates.js';
export * from './files.js';
export * from './contexts.js';
export * from './cluster.js';

/** Every component, in the order docs/openapi.json lists them. */
export const COMPONENTS: readonly Component[] = [
  ErrorBody,
  SandboxId,
  Sandbox,
  SandboxInfo,
  SandboxList,
  CreateRequest,
  ExecRequest,
  ExecEvent,
  ForkRequest,
  ForkResponse,
  MergeResponse,
  Snapshot,
  SnapshotList,
  SnapshotRequest,
  SandboxState,
  TimeoutRequest,
  Template,
  TemplateList,
  FileEntry,
  FileWritten,
  CellError,
  Context,
  ContextList,
  ContextCreateRequest,
  DrainReport,
  ClusterNode,
  ClusterInfo,
];

/** Components by name: what a checker resolves `$ref`s against. */
export const COMPONENT_CONTEXT: Readonly<Record<string, Component>> = Object.fromEntries(
  COMPONENTS.map((c) => [idOf(c), c]),
);
