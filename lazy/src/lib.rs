//! gstore's lazy-pages daemon: brings a CRIU process image back from the store without writing
//! its memory to disk first.
//!
//! `criu restore --lazy-pages` restores everything but the private anonymous memory, hands
//! each restored task's userfaultfd to a daemon listening on `<image dir>/lazy-pages.socket`
//! and lets the tasks run; the daemon must supply every page they touch. gstore is that daemon:
//!
//! - [`prepare`] writes out only what CRIU reads itself: the small image files, and the
//!   `pages-N.img` files as sparse files holding just the pages CRIU restores eagerly.
//! - [`layout`] reads from those files which address ranges are lazy and where their bytes are.
//! - [`fill`] receives the tasks ([`socket`]), answers faults at once and meanwhile fills every
//!   lazy page from many threads with large `UFFDIO_COPY`s ([`uffd`]), decoding chunks
//!   straight from the store ([`fetch`]), reading ahead behind faults ([`ahead`]), otherwise in
//!   profile order ([`profile`]), then closes the userfaultfds so that the kernel handles everything that is left (holes) itself.
//! - [`during`] runs it all around a caller's restore (gstore's CRIU, or runc's).
//! - [`guard`] keeps a restored process from ever running on missing memory: a small forked
//!   process holds the userfaultfds too and kills the restored tree if the daemon dies first.

#![deny(missing_docs)]

pub mod ahead;
pub mod during;
pub mod error;
pub mod fetch;
pub mod fill;
pub mod guard;
pub mod layout;
pub mod mode;
pub mod prepare;
pub mod profile;
pub mod socket;
pub mod uffd;

pub use error::{LazyError, Result};
pub use fill::{serve, FillOptions, FillReport};
pub use prepare::{prepare, Prepared};
