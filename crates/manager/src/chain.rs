//! An error and its causes on one line, as logs and job traces show them.

use std::error::Error;
use std::fmt;

/// Shows an error and each of its sources joined by `": "`, as `{:#}` of an `anyhow::Error`
/// does: the manager's messages read the same whatever error type they carry.
#[derive(Debug)]
pub(crate) struct Chain<'a>(pub(crate) &'a (dyn Error + 'static));

impl fmt::Display for Chain<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)?;
        let mut source = self.0.source();
        while let Some(s) = source {
            write!(f, ": {s}")?;
            source = s.source();
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("outer")]
    struct Outer(#[source] std::io::Error);

    #[test]
    fn joins_every_cause() {
        let e = Outer(std::io::Error::other("inner"));
        assert_eq!(Chain(&e).to_string(), "outer: inner");
    }
}
