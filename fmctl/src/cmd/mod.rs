//! The subcommands of `fmctl` beyond a single call, one module each, and
//! the command line they share (`args`).

pub(crate) mod admin;
pub(crate) mod args;
pub(crate) mod bench;
pub(crate) mod watch;
