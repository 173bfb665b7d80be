//! The simulation's shared core: the data every model, the world, the schedule generator and the
//! driver share, and nothing that runs. The fixed shape of a run (`constants`), keys as the
//! model keeps them (`keys`), the model's truth (`fabric`: ports, the SM's state for the node,
//! sets on their way) with the SM host's and the model UFM's parts of it (`sm_host_view`,
//! `ufm_world`), a crash armed for the next apply (`apply_crash`), a run's temp files (`disk`),
//! a schedule's data (`command`, `plan`, `watcher_plan`), and the node's stepped wall clock
//! (`wall`).
//!
//! Imports point one way: `core` uses nothing else of `sim`, and inside it `constants` <-
//! `keys` <- `fabric`; `command`, `watcher_plan` <- `plan`.

pub mod apply_crash;
pub mod command;
pub mod constants;
pub mod disk;
pub mod fabric;
pub mod keys;
pub mod plan;
pub mod sm_host_view;
pub mod ufm_world;
pub mod wall;
pub mod watcher_plan;
