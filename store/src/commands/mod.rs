//! What is done with a store: push (from files, streams or memory pieces), copy, compose, verify,
//! the everyday image listings, key records, usage and garbage collection.

pub mod compose;
pub mod copy;
pub mod gc;
pub mod images;
pub mod keys;
mod pack_fill;
pub mod push;
pub mod usage;
pub mod verify;
