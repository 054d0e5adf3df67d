//! lanefs's FUSE engine: our own implementation of the kernel's FUSE protocol (7.45), with
//! two transports: cloned /dev/fuse queues, or one io_uring per CPU (FUSE over io_uring). See ARCHITECTURE.md for the layers.

pub mod abi;
pub mod atime;
pub mod caller;
pub mod control;
pub mod dev;
pub mod dispatch;
pub mod fileattr;
pub mod filesystem;
pub mod mount;
pub mod notify;
pub mod offload;
pub mod reply;
pub mod request;
pub mod ring;
pub mod session;
pub mod stats;
pub mod topology;
pub mod uring;

pub use filesystem::{Connection, Filesystem, InitRequest, Request};
pub use reply::{DirBuffer, DirEntry, Reply};
pub use session::{Labels, SessionOptions, Transport};
