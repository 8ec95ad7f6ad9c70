//! What is done with a store: push (from files, streams or memory pieces), copy, compose,
//! verify, the everyday image listings, usage and garbage collection.

pub mod compose;
pub mod copy;
pub mod gc;
pub mod images;
pub mod push;
pub mod usage;
pub mod verify;
