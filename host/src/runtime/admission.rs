//! What a component must be before the host links it: checks on its binary that wasmtime's own
//! validation does not make, and which WASI it serves, to choose its engine.

use wasmparser::{CanonicalFunction, CanonicalOption, Parser, Payload};

use crate::error::Refusal;

/// Checks `bytes`, a component's binary, against the host's rules: every function through which
/// the guest hands values to the host (a lowered import, and the component model's async
/// built-ins) uses UTF-8 strings. Lifted exports may use any encoding: there the host writes
/// into the guest's memory, not the other way round. Run it on a binary wasmtime has accepted:
/// one that does not parse here is refused.
pub fn check(bytes: &[u8]) -> Result<(), Refusal> {
    let mut index = 0;
    for payload in Parser::new(0).parse_all(bytes) {
        let Payload::ComponentCanonicalSection(section) = payload? else {
            continue;
        };
        for function in section {
            let function = function?;
            if let Some(encoding) = host_bound_encoding(&function) {
                return Err(Refusal::StringEncoding { encoding, index });
            }
            index += 1;
        }
    }
    Ok(())
}

/// Whether `bytes`, a component's binary, exports WASIp3's `wasi:http/handler@0.3` at its top
/// level (not inside a nested component). Read before wasmtime compiles it, to choose the
/// engine: bytes that do not parse here are not a WASIp3 guest, and the WASIp2 engine says why.
pub fn exports_wasip3_handler(bytes: &[u8]) -> bool {
    // Each module or component, the outer one included, opens with a version and closes with
    // an end: depth 1 is the outer component.
    let mut depth = 0usize;
    for payload in Parser::new(0).parse_all(bytes) {
        match payload {
            Ok(Payload::Version { .. }) => depth += 1,
            Ok(Payload::End(_)) => depth = depth.saturating_sub(1),
            Ok(Payload::ComponentExportSection(exports)) if depth == 1 => {
                for export in exports {
                    let Ok(export) = export else { return false };
                    if export.name.name.starts_with(WASIP3_HANDLER) {
                        return true;
                    }
                }
            }
            Ok(_) => {}
            Err(_) => return false,
        }
    }
    false
}

/// The name, less its patch version, of the interface a WASIp3 HTTP guest exports.
const WASIP3_HANDLER: &str = "wasi:http/handler@0.3.";

/// The non-UTF-8 string encoding of a function that hands the host values, if it has one.
fn host_bound_encoding(function: &CanonicalFunction) -> Option<&'static str> {
    let options = match function {
        CanonicalFunction::Lift { .. } => return None,
        CanonicalFunction::Lower { options, .. }
        | CanonicalFunction::TaskReturn { options, .. }
        | CanonicalFunction::StreamRead { options, .. }
        | CanonicalFunction::StreamWrite { options, .. }
        | CanonicalFunction::FutureRead { options, .. }
        | CanonicalFunction::FutureWrite { options, .. }
        | CanonicalFunction::ErrorContextNew { options, .. }
        | CanonicalFunction::ErrorContextDebugMessage { options, .. } => options,
        _ => return None,
    };
    options.iter().find_map(|option| match option {
        CanonicalOption::UTF16 => Some("UTF-16"),
        CanonicalOption::CompactUTF16 => Some("latin1+UTF-16"),
        _ => None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A component that imports the host's `users.get` and lowers it with `encoding`.
    fn component_lowering_get_with(encoding: &str) -> Vec<u8> {
        wat::parse_str(format!(
            r#"(component
                (import "tutorial:service/users@0.2.1" (instance $users
                    (export "get" (func (param "id" string) (result (option string))))))
                (alias export $users "get" (func $get))
                (core module $libc
                    (memory (export "memory") 1)
                    (func (export "realloc") (param i32 i32 i32 i32) (result i32) unreachable))
                (core instance $libc (instantiate $libc))
                (core func (canon lower (func $get) {encoding}
                    (memory $libc "memory") (realloc (func $libc "realloc")))))"#
        ))
        .expect("the test component parses")
    }

    #[test]
    fn a_component_that_passes_utf16_strings_to_the_host_is_refused() {
        for (option, named) in [
            ("string-encoding=utf16", "UTF-16"),
            ("string-encoding=latin1+utf16", "latin1+UTF-16"),
        ] {
            let refusal = check(&component_lowering_get_with(option)).unwrap_err();
            assert!(
                matches!(refusal, Refusal::StringEncoding { encoding, .. } if encoding == named),
                "{refusal}"
            );
            assert!(refusal.to_string().contains("only UTF-8"), "{refusal}");
        }
    }

    #[test]
    fn a_component_that_passes_utf8_strings_is_accepted() {
        check(&component_lowering_get_with("string-encoding=utf8")).unwrap();
        check(&component_lowering_get_with("")).unwrap();
    }

    /// A component exporting an instance named `name` with one function, at the top level or
    /// `nested` inside an inner component.
    fn component_exporting(name: &str, nested: bool) -> Vec<u8> {
        let export = format!(
            r#"(core module $m (func (export "f")))
               (core instance $i (instantiate $m))
               (func $f (canon lift (core func $i "f")))
               (instance $handler (export "handle" (func $f)))
               (export "{name}" (instance $handler))"#
        );
        let text = if nested {
            format!("(component (component {export}))")
        } else {
            format!("(component {export})")
        };
        wat::parse_str(text).expect("the test component parses")
    }

    #[test]
    fn a_component_exporting_the_wasip3_handler_is_served_as_wasip3() {
        assert!(exports_wasip3_handler(&component_exporting(
            "wasi:http/handler@0.3.0",
            false
        )));
        assert!(exports_wasip3_handler(&component_exporting(
            "wasi:http/handler@0.3.1",
            false
        )));
    }

    #[test]
    fn only_the_outer_components_exports_choose_wasip3() {
        for (name, nested) in [
            ("wasi:http/incoming-handler@0.2.6", false),
            ("wasi:http/handler@0.3.0", true),
            ("wasi:http/handler@0.30.0", false),
        ] {
            assert!(
                !exports_wasip3_handler(&component_exporting(name, nested)),
                "{name}, nested: {nested}"
            );
        }
        assert!(!exports_wasip3_handler(b"\0asm\x0d\0\x01\0garbage"));
    }

    #[test]
    fn bytes_that_cannot_be_read_through_are_refused() {
        assert!(matches!(
            check(b"\0asm\x0d\0\x01\0garbage"),
            Err(Refusal::Unreadable(_))
        ));
    }
}
