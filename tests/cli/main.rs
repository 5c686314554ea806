//! CLI integration tests: the `rpull` binary run as a user runs it (clean environment, own HOME)
//! against real `docker-registry` processes started by `rpull-testing`.

mod auth;
mod common;
mod fast_path;
mod help;
mod interrupt;
mod memory;
mod output;
mod ownership;
mod transport;
