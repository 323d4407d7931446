//! The subcommands of `fmsim`, one module each, and what they share
//! (`args`, `setup`). The simulator itself is the `fmsched-sim` library.

pub(crate) mod args;
pub(crate) mod bench;
pub(crate) mod compare;
pub(crate) mod fidelity;
pub(crate) mod generate;
pub(crate) mod icefrog;
pub(crate) mod job_file;
pub(crate) mod lyra;
pub(crate) mod prompttuner;
pub(crate) mod setup;
pub(crate) mod sweep;
pub(crate) mod tune;

#[cfg(test)]
mod tests;
