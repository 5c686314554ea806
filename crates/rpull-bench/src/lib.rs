//! The measuring instrument behind `rpull bench`: each stage of a pull measured alone (network,
//! decompress, extract) and end to end, peers (docker, podman, ctr, skopeo, crane) run on the same
//! image, sweeps, and the reports (table, JSON, CSV, SVG chart).

mod bench;
pub mod daemons;
mod error;
pub mod generate;
mod model;
pub mod peers;
pub mod report;
pub mod resources;
pub mod stages;
mod stats;
pub mod sweep;

pub use bench::{
    Bench, BenchOptions, DEFAULT_CHUNK_SIZE, Destination, SCHEMA_VERSION, floor_terms,
};
pub use error::BenchError;
pub use model::{
    BenchReport, CodecThroughput, FloorTerms, MachineInfo, PeerResult, Sample, StageResult,
    SweepPoint, SweepResult,
};
pub use stats::Summary;
