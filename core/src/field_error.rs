//! [`FieldError`]: a rejected input, naming its field. Every check of user
//! input in core (a job spec, a queue configuration) answers with one, and
//! the services turn it into `INVALID_ARGUMENT` with the same message.

use std::fmt;

/// A rejected input: which field, and why.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub struct FieldError {
    pub field: String,
    pub message: String,
}

impl FieldError {
    pub fn new(field: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            field: field.into(),
            message: message.into(),
        }
    }
}

impl fmt::Display for FieldError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.field, self.message)
    }
}
