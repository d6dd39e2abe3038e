//! The annotations `clusterctl move` reads and writes on the objects it moves, and those bitpool
//! sets on a pool for the move (see [`crate::ipam::moving`]).

/// clusterctl waits, after pausing the Clusters, until no object it moves carries this.
pub const BLOCK_MOVE_ANNOTATION: &str = "clusterctl.cluster.x-k8s.io/block-move";
/// clusterctl sets this (alone: it replaces every other annotation) on each source object
/// before deleting it.
pub const DELETE_FOR_MOVE_ANNOTATION: &str = "clusterctl.cluster.x-k8s.io/delete-for-move";
/// The ledger handed over for a move (`Handover`, JSON).
pub const HANDOVER_ANNOTATION: &str = "ipam.bitpool.dev/handover";
/// On a pool that arrived by a move, until the move is over (`MovedIn`, JSON).
pub const MOVED_IN_ANNOTATION: &str = "ipam.bitpool.dev/moved-in";
