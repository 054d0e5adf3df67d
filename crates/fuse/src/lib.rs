//! lanefs's FUSE engine: our own implementation of the kernel's FUSE protocol (7.45), with
//! one cloned /dev/fuse queue per worker thread. See ARCHITECTURE.md for the layers.

pub mod abi;
pub mod control;
pub mod dev;
pub mod dispatch;
pub mod filesystem;
pub mod mount;
pub mod reply;
pub mod request;
pub mod session;
pub mod stats;
pub mod topology;

pub use filesystem::{Connection, Filesystem, InitRequest, Request};
pub use reply::{DirBuffer, DirEntry, Reply};
pub use session::{Labels, SessionOptions};
