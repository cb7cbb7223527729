//! The contract's limits on what a client may send: the one place their numbers live, read by
//! the validation that enforces them and by the error messages that state them.

/// The longest accepted `name`, in characters after trimming.
pub const MAX_NAME_CHARS: usize = 200;
/// The longest accepted `email`, in characters.
pub const MAX_EMAIL_CHARS: usize = 254;
/// The largest `n` the API accepts: F(35) already takes tens of milliseconds on purpose.
pub const MAX_N: u32 = 35;
