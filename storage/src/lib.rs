//! envace storage: sled trees for tasks, seed trajectories, rollouts, rehearsal memories and run
//! state (issue 4). It knows bytes and keys, never tensors or actors.
