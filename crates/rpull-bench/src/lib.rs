//! The measuring instrument behind `rpull bench`: each stage of a pull measured alone (network,
//! decompress, extract) and end to end, peers (docker, podman, ctr, skopeo, crane) run on the same
//! image, sweeps, and the reports (table, JSON, CSV, SVG chart).

mod model;
mod stats;

pub use model::{BenchReport, MachineInfo, PeerResult, Sample, StageResult, SweepPoint, SweepResult};
pub use stats::Summary;
