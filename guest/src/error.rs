//! The guest's one error type: every way a request can fail, with its status and message.

use alloc::format;
use alloc::string::String;

use crate::limits::{MAX_N, MAX_NAME_CHARS};

/// A request the API refuses. Each variant knows its HTTP status and its client-facing message;
/// messages never echo client input.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ApiError {
    /// No route has this path.
    NotFound,
    /// The route exists but not for this method; carries the methods it does allow.
    MethodNotAllowed(&'static [&'static str]),
    /// A `POST` whose `Content-Type` is missing or not `application/json`.
    UnsupportedMediaType,
    /// The body could not be read from the connection.
    UnreadableBody,
    /// The body is not valid JSON.
    InvalidJson,
    /// The body is valid JSON but not an object.
    NotAnObject,
    /// A required field is absent (or `null`).
    MissingField(&'static str),
    /// A field that must be a string is some other JSON type.
    NotAString(&'static str),
    /// `name` is empty after trimming, or longer than the limit.
    InvalidName,
    /// `email` is a string but not an acceptable address.
    InvalidEmail,
    /// A field that must be a JSON integer is some other JSON value.
    NotAnInteger(&'static str),
    /// `n` is an integer outside `0..=MAX_N`.
    NOutOfRange,
    /// The id is unknown or not a UUID.
    UserNotFound,
    /// Another user already has this e-mail address.
    DuplicateEmail,
    /// The user store is at capacity.
    StoreFull,
    /// The user store could not answer (unreachable, failing, too slow).
    StoreUnavailable,
}

impl ApiError {
    /// The HTTP status code this error is answered with.
    pub fn status(self) -> u16 {
        match self {
            ApiError::NotFound | ApiError::UserNotFound => 404,
            ApiError::MethodNotAllowed(_) => 405,
            ApiError::UnsupportedMediaType => 415,
            ApiError::DuplicateEmail => 409,
            ApiError::StoreFull | ApiError::StoreUnavailable => 503,
            ApiError::UnreadableBody
            | ApiError::InvalidJson
            | ApiError::NotAnObject
            | ApiError::MissingField(_)
            | ApiError::NotAString(_)
            | ApiError::InvalidName
            | ApiError::InvalidEmail
            | ApiError::NotAnInteger(_)
            | ApiError::NOutOfRange => 400,
        }
    }

    /// The human-readable message of the `{"error": ...}` body.
    pub fn message(self) -> String {
        match self {
            ApiError::NotFound => "Not found".into(),
            ApiError::MethodNotAllowed(_) => "Method not allowed".into(),
            ApiError::UnsupportedMediaType => "Content-Type must be application/json".into(),
            ApiError::UnreadableBody => "Could not read the request body".into(),
            ApiError::InvalidJson => "Request body is not valid JSON".into(),
            ApiError::NotAnObject => "Request body must be a JSON object".into(),
            ApiError::MissingField(field) => format!("Missing required field: {field}"),
            ApiError::NotAString(field) => format!("Field '{field}' must be a string"),
            ApiError::InvalidName => {
                format!("Field 'name' must be 1 to {MAX_NAME_CHARS} characters")
            }
            ApiError::InvalidEmail => "Invalid email format".into(),
            ApiError::NotAnInteger(field) => format!("Field '{field}' must be an integer"),
            ApiError::NOutOfRange => format!("Field 'n' must be between 0 and {MAX_N}"),
            ApiError::UserNotFound => "User not found".into(),
            ApiError::DuplicateEmail => "A user with this email already exists".into(),
            ApiError::StoreFull => "User store is full".into(),
            ApiError::StoreUnavailable => "User store unavailable".into(),
        }
    }
}
