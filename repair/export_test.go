package repair

// SnapshotFromProto is snapshotFromProto, for the external tests.
var SnapshotFromProto = snapshotFromProto
