//! The contract's rules for request bodies and path parameters.

use alloc::string::{String, ToString};
use alloc::vec::Vec;

use serde_json::{Map, Value};

use crate::error::ApiError;
use crate::limits::{MAX_EMAIL_CHARS, MAX_N, MAX_NAME_CHARS};

/// A validated `POST /api/users` body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewUser {
    /// The name, trimmed.
    pub name: String,
    /// The e-mail address, as given.
    pub email: String,
}

/// Whether a `Content-Type` header announces JSON; parameters such as `charset` are ignored.
pub fn is_json_content_type(content_type: Option<&str>) -> bool {
    content_type.is_some_and(|value| {
        let media_type = value.split(';').next().unwrap_or_default().trim();
        media_type.eq_ignore_ascii_case("application/json")
    })
}

/// Parses a request body that must be a JSON object.
pub fn json_object(body: &[u8]) -> Result<Map<String, Value>, ApiError> {
    match serde_json::from_slice(body) {
        Ok(Value::Object(object)) => Ok(object),
        Ok(_) => Err(ApiError::NotAnObject),
        Err(_) => Err(ApiError::InvalidJson),
    }
}

/// Validates a user creation body; unknown extra fields are ignored.
pub fn new_user(body: &Map<String, Value>) -> Result<NewUser, ApiError> {
    let name = required_string(body, "name")?.trim();
    let email = required_string(body, "email")?;
    if name.is_empty() || name.chars().count() > MAX_NAME_CHARS {
        return Err(ApiError::InvalidName);
    }
    if !is_valid_email(email) {
        return Err(ApiError::InvalidEmail);
    }
    Ok(NewUser {
        name: name.to_string(),
        email: email.to_string(),
    })
}

/// Validates a compute body and returns `n`: a JSON integer (no fraction, no exponent) in
/// `0..=MAX_N`.
pub fn compute_n(body: &Map<String, Value>) -> Result<u32, ApiError> {
    let number = match body.get("n") {
        None | Some(Value::Null) => return Err(ApiError::MissingField("n")),
        Some(Value::Number(number)) if !number.is_f64() => number,
        Some(_) => return Err(ApiError::NotAnInteger("n")),
    };
    number
        .as_i64()
        .and_then(|n| u32::try_from(n).ok())
        .filter(|&n| n <= MAX_N)
        .ok_or(ApiError::NOutOfRange)
}

/// The e-mail rule: at most 254 characters, exactly one `@`, a non-empty local part, a domain of
/// at least two non-empty dot-separated labels, and no white space or control characters.
pub fn is_valid_email(email: &str) -> bool {
    if email.chars().count() > MAX_EMAIL_CHARS
        || email.chars().any(|c| c.is_whitespace() || c.is_control())
    {
        return false;
    }
    let Some((local, domain)) = email.split_once('@') else {
        return false;
    };
    let labels: Vec<&str> = domain.split('.').collect();
    !local.is_empty()
        && !domain.contains('@')
        && labels.len() >= 2
        && labels.iter().all(|label| !label.is_empty())
}

/// The canonical form (lower-case, hyphenated) of a user id path segment, or `None` when the
/// segment is not a UUID. Any letter case is accepted.
pub fn user_id(segment: &str) -> Option<String> {
    uuid::Uuid::try_parse(segment)
        .ok()
        .map(|id| id.hyphenated().to_string())
}

fn required_string<'a>(
    body: &'a Map<String, Value>,
    field: &'static str,
) -> Result<&'a str, ApiError> {
    match body.get(field) {
        None | Some(Value::Null) => Err(ApiError::MissingField(field)),
        Some(Value::String(value)) => Ok(value),
        Some(_) => Err(ApiError::NotAString(field)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn object(value: Value) -> Map<String, Value> {
        value.as_object().expect("test bodies are objects").clone()
    }

    #[test]
    fn json_content_type_accepts_parameters_and_any_case() {
        assert!(is_json_content_type(Some("application/json")));
        assert!(is_json_content_type(Some(
            "application/json; charset=utf-8"
        )));
        assert!(is_json_content_type(Some("Application/JSON")));
    }

    #[test]
    fn other_or_missing_content_types_are_refused() {
        assert!(!is_json_content_type(None));
        assert!(!is_json_content_type(Some("")));
        assert!(!is_json_content_type(Some("text/plain")));
        assert!(!is_json_content_type(Some("application/jsonx")));
        assert!(!is_json_content_type(Some(
            "application/x-www-form-urlencoded"
        )));
    }

    #[test]
    fn a_body_must_be_a_json_object() {
        assert_eq!(
            json_object(b"{not json").unwrap_err(),
            ApiError::InvalidJson
        );
        assert_eq!(json_object(b"").unwrap_err(), ApiError::InvalidJson);
        assert_eq!(json_object(b"[1,2]").unwrap_err(), ApiError::NotAnObject);
        assert_eq!(json_object(b"\"text\"").unwrap_err(), ApiError::NotAnObject);
        assert_eq!(json_object(b"null").unwrap_err(), ApiError::NotAnObject);
        assert!(json_object(br#"{"a":1}"#).is_ok());
    }

    #[test]
    fn valid_emails_are_accepted() {
        for email in [
            "a@b.co",
            "first.last+tag@example.com",
            "x@sub.domain.org",
            "Ü@bücher.de",
        ] {
            assert!(is_valid_email(email), "{email}");
        }
    }

    #[test]
    fn invalid_emails_are_refused() {
        let too_long = format!("{}@example.com", "a".repeat(250));
        for email in [
            "",
            "plain",
            "@example.com",
            "user@",
            "user@localhost",
            "user@@example.com",
            "a@b@c.com",
            "user@.com",
            "user@example.",
            "user@exa..mple.com",
            "us er@example.com",
            "user@example.com ",
            "user\t@example.com",
            "user\u{0}@example.com",
            &too_long,
        ] {
            assert!(!is_valid_email(email), "{email:?}");
        }
    }

    #[test]
    fn an_email_of_exactly_254_characters_is_accepted() {
        let email = format!("{}@example.com", "a".repeat(254 - "@example.com".len()));
        assert_eq!(email.chars().count(), 254);
        assert!(is_valid_email(&email));
    }

    #[test]
    fn a_new_user_is_trimmed_and_keeps_its_email_as_given() {
        let user = new_user(&object(
            json!({"name": "  Ada  ", "email": "Ada@Example.com", "extra": 1}),
        ));
        assert_eq!(
            user,
            Ok(NewUser {
                name: "Ada".into(),
                email: "Ada@Example.com".into()
            })
        );
    }

    #[test]
    fn missing_or_null_fields_are_named() {
        assert_eq!(
            new_user(&object(json!({"email": "a@b.co"}))),
            Err(ApiError::MissingField("name"))
        );
        assert_eq!(
            new_user(&object(json!({"name": "A"}))),
            Err(ApiError::MissingField("email"))
        );
        assert_eq!(
            new_user(&object(json!({"name": "A", "email": null}))),
            Err(ApiError::MissingField("email"))
        );
    }

    #[test]
    fn wrongly_typed_fields_are_refused() {
        assert_eq!(
            new_user(&object(json!({"name": 5, "email": "a@b.co"}))),
            Err(ApiError::NotAString("name"))
        );
        assert_eq!(
            new_user(&object(json!({"name": "A", "email": ["a@b.co"]}))),
            Err(ApiError::NotAString("email"))
        );
    }

    #[test]
    fn names_must_have_1_to_200_characters_after_trimming() {
        let email = "a@b.co";
        assert_eq!(
            new_user(&object(json!({"name": "   ", "email": email}))),
            Err(ApiError::InvalidName)
        );
        assert_eq!(
            new_user(&object(json!({"name": "", "email": email}))),
            Err(ApiError::InvalidName)
        );
        let longest = "é".repeat(200);
        assert!(new_user(&object(json!({"name": longest, "email": email}))).is_ok());
        let too_long = "é".repeat(201);
        assert_eq!(
            new_user(&object(json!({"name": too_long, "email": email}))),
            Err(ApiError::InvalidName)
        );
    }

    #[test]
    fn a_bad_email_gives_the_spec_message() {
        let error = new_user(&object(json!({"name": "A", "email": "nope"}))).unwrap_err();
        assert_eq!(error, ApiError::InvalidEmail);
        assert_eq!(error.message(), "Invalid email format");
    }

    #[test]
    fn n_accepts_integers_from_0_to_35() {
        assert_eq!(compute_n(&object(json!({"n": 0}))), Ok(0));
        assert_eq!(compute_n(&object(json!({"n": 35}))), Ok(35));
    }

    #[test]
    fn n_out_of_range_is_refused() {
        for n in [36, 50, 100, -1, i64::MIN] {
            assert_eq!(
                compute_n(&object(json!({"n": n}))),
                Err(ApiError::NOutOfRange),
                "{n}"
            );
        }
        assert_eq!(
            compute_n(&object(json!({"n": u64::MAX}))),
            Err(ApiError::NOutOfRange)
        );
    }

    #[test]
    fn n_must_be_a_json_integer() {
        for body in [
            json!({"n": 1.5}),
            json!({"n": "10"}),
            json!({"n": true}),
            json!({"n": [10]}),
        ] {
            assert_eq!(
                compute_n(&object(body.clone())),
                Err(ApiError::NotAnInteger("n")),
                "{body}"
            );
        }
        for text in [r#"{"n": 10.0}"#, r#"{"n": 1e1}"#] {
            let body = json_object(text.as_bytes()).unwrap();
            assert_eq!(compute_n(&body), Err(ApiError::NotAnInteger("n")), "{text}");
        }
        assert_eq!(
            compute_n(&object(json!({"n": null}))),
            Err(ApiError::MissingField("n"))
        );
        assert_eq!(
            compute_n(&object(json!({}))),
            Err(ApiError::MissingField("n"))
        );
    }

    #[test]
    fn user_ids_are_parsed_in_any_case_and_made_canonical() {
        let canonical = "6f1c3c1e-8a1b-4c2d-9e3f-0a1b2c3d4e5f";
        assert_eq!(user_id(canonical).as_deref(), Some(canonical));
        assert_eq!(
            user_id(&canonical.to_uppercase()).as_deref(),
            Some(canonical)
        );
    }

    #[test]
    fn ids_that_are_not_uuids_have_no_canonical_form() {
        for segment in [
            "",
            "42",
            "not-a-uuid",
            "6f1c3c1e-8a1b-4c2d-9e3f-0a1b2c3d4e5",
            "zf1c3c1e-8a1b-4c2d-9e3f-0a1b2c3d4e5f",
        ] {
            assert_eq!(user_id(segment), None, "{segment}");
        }
    }
}
