//! lanefs volume
