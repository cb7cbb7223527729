//! Lifting what a guest passes to the host: strings are read where they lie in guest memory,
//! only while the request's allowance lasts, and copied only once they are known to fit.
//!
//! Generated bindings would copy every string and list into host memory before any code of ours
//! ran (a list of attributes all naming one 64 MiB string would cost gigabytes); here the rules
//! of what a guest may hand over are enforced while reading, in one place, and tested on plain
//! strings.

use std::borrow::Cow;

use wasmtime::StoreContextMut;
use wasmtime::component::{ComponentType, Lift, WasmList, WasmStr};

use crate::interfaces::bindings::telemetry::{Attribute, Value};

/// The longest span name, attribute key, text value or log message kept; longer ones are cut.
pub const MAX_VALUE_BYTES: usize = 4 * 1024;

/// The bytes a number counts against an allowance.
const NUMBER_BYTES: usize = 8;

/// A string the guest passed, not read yet.
pub trait RawText {
    /// Reads it (from guest memory: the whole string is checked to be UTF-8).
    fn read(&self) -> wasmtime::Result<Cow<'_, str>>;
}

/// A string in a guest's memory, with the store whose memory it lies in.
pub struct InGuest<'a, 's, T: 'static> {
    text: &'a WasmStr,
    store: &'a StoreContextMut<'s, T>,
}

impl<'a, 's, T: 'static> InGuest<'a, 's, T> {
    /// `text`, which lies in `store`'s guest memory.
    pub fn new(text: &'a WasmStr, store: &'a StoreContextMut<'s, T>) -> InGuest<'a, 's, T> {
        InGuest { text, store }
    }
}

impl<T: 'static> RawText for InGuest<'_, '_, T> {
    fn read(&self) -> wasmtime::Result<Cow<'_, str>> {
        self.text.to_str(self.store)
    }
}

impl RawText for &str {
    fn read(&self) -> wasmtime::Result<Cow<'_, str>> {
        Ok(Cow::Borrowed(self))
    }
}

/// An attribute value the guest passed, its text (if any) not read yet.
pub enum RawValue<S> {
    /// A string.
    Text(S),
    /// A signed integer.
    Integer(i64),
    /// A float.
    Float(f64),
    /// A boolean.
    Boolean(bool),
}

/// An attribute as the guest passed it, its strings still in guest memory: the component-model
/// shape of `telemetry.attribute`, lifted without copying its strings.
#[derive(ComponentType, Lift)]
#[component(record)]
pub struct WireAttribute {
    key: WasmStr,
    value: WireValue,
}

/// A value as the guest passed it.
#[derive(ComponentType, Lift)]
#[component(variant)]
pub enum WireValue {
    /// A string, still in guest memory.
    #[component(name = "text")]
    Text(WasmStr),
    /// A signed integer.
    #[component(name = "integer")]
    Integer(i64),
    /// A float.
    #[component(name = "float")]
    Float(f64),
    /// A boolean.
    #[component(name = "boolean")]
    Boolean(bool),
}

/// What the rest of one request may still lift, across all its calls.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Allowance {
    /// Bytes of names, keys, text values and messages (a number counts 8).
    pub bytes: usize,
    /// Attributes, over all spans and log events.
    pub attributes: u32,
}

/// The attributes one call lifted, and how many it passed that were not.
#[derive(Debug, Default, PartialEq)]
pub struct Lifted {
    /// Lifted, in the guest's order, each within [`MAX_VALUE_BYTES`].
    pub attributes: Vec<Attribute>,
    /// Passed by the guest but dropped: past the allowance, never read.
    pub dropped: u64,
}

/// The guest's string, if it is at most `max` bytes; a longer one is not copied.
pub fn bounded_text(raw: &impl RawText, max: usize) -> wasmtime::Result<Option<String>> {
    let text = raw.read()?;
    Ok((text.len() <= max).then(|| text.into_owned()))
}

/// The guest's string, if it is at most `max` bytes and the allowance still holds it: its
/// length is spent. A longer one spends the rest of the allowance and is dropped, so a guest
/// gets the host to read at most one string past its allowance; with nothing left, nothing is
/// read at all (reading checks the whole string as UTF-8, however long).
pub fn metered_text(
    raw: &impl RawText,
    max: usize,
    allowance: &mut Allowance,
) -> wasmtime::Result<Option<String>> {
    if allowance.bytes == 0 {
        return Ok(None);
    }
    let text = raw.read()?;
    if text.len() > max.min(allowance.bytes) {
        allowance.bytes = 0;
        return Ok(None);
    }
    allowance.bytes -= text.len();
    Ok(Some(text.into_owned()))
}

/// The guest's string, cut to [`MAX_VALUE_BYTES`], if the allowance still holds all of it: the
/// cut length is spent. A string longer than what is left spends the rest, and is dropped; with
/// nothing left, nothing is read at all.
pub fn text(raw: &impl RawText, allowance: &mut Allowance) -> wasmtime::Result<Option<String>> {
    if allowance.bytes == 0 {
        return Ok(None);
    }
    let text = raw.read()?;
    if text.len() > allowance.bytes {
        allowance.bytes = 0;
        return Ok(None);
    }
    let kept = text[..text.floor_char_boundary(MAX_VALUE_BYTES)].to_string();
    allowance.bytes -= kept.len();
    Ok(Some(kept))
}

/// One attribute, if the allowance holds one more and all its strings: it spends one attribute
/// and the bytes of its key and value. `None` when it does not fit.
pub fn attribute<S: RawText>(
    key: &S,
    value: RawValue<&S>,
    allowance: &mut Allowance,
) -> wasmtime::Result<Option<Attribute>> {
    if allowance.attributes == 0 {
        return Ok(None);
    }
    let Some(key) = text(key, allowance)? else {
        return Ok(None);
    };
    let value = match value {
        RawValue::Text(raw) => text(raw, allowance)?.map(Value::Text),
        RawValue::Integer(number) => spend_number(allowance).then_some(Value::Integer(number)),
        RawValue::Float(number) => spend_number(allowance).then_some(Value::Float(number)),
        RawValue::Boolean(flag) => spend_number(allowance).then_some(Value::Boolean(flag)),
    };
    let Some(value) = value else {
        return Ok(None);
    };
    allowance.attributes -= 1;
    Ok(Some(Attribute { key, value }))
}

/// Spends the bytes of a number, if they are left; spends the rest otherwise.
fn spend_number(allowance: &mut Allowance) -> bool {
    let fits = allowance.bytes >= NUMBER_BYTES;
    allowance.bytes = if fits {
        allowance.bytes - NUMBER_BYTES
    } else {
        0
    };
    fits
}

/// As many of the `passed` attributes as the allowance holds, lifted in order by `lift_one`
/// (given the index and the allowance); the first that does not fit ends the reading, and it and
/// the rest are counted as dropped, unread. Past the allowance's count, none is even fetched.
pub fn attributes(
    passed: usize,
    allowance: &mut Allowance,
    mut lift_one: impl FnMut(usize, &mut Allowance) -> wasmtime::Result<Option<Attribute>>,
) -> wasmtime::Result<Lifted> {
    let mut lifted = Vec::new();
    // With no bytes left, even an entry's handle is not fetched.
    let fetch = if allowance.bytes == 0 {
        0
    } else {
        passed.min(allowance.attributes as usize)
    };
    for index in 0..fetch {
        match lift_one(index, allowance)? {
            Some(attribute) => lifted.push(attribute),
            None => break,
        }
    }
    Ok(Lifted {
        dropped: (passed - lifted.len()) as u64,
        attributes: lifted,
    })
}

/// [`attributes`] of a list in guest memory, fetched one entry at a time: wasmtime charges what
/// a host call copies against a budget of its own, and each entry's strings count.
pub fn guest_attributes<T: 'static>(
    store: &mut StoreContextMut<'_, T>,
    list: &WasmList<WireAttribute>,
    allowance: &mut Allowance,
) -> wasmtime::Result<Lifted> {
    attributes(list.len(), allowance, |index, allowance| {
        match list.get(&mut *store, index) {
            Some(wire) => guest_attribute(store, &wire?, allowance),
            None => Ok(None),
        }
    })
}

/// [`guest_attributes`] of one attribute.
pub fn guest_attribute<T: 'static>(
    store: &StoreContextMut<'_, T>,
    WireAttribute { key, value }: &WireAttribute,
    allowance: &mut Allowance,
) -> wasmtime::Result<Option<Attribute>> {
    let key = InGuest::new(key, store);
    match value {
        WireValue::Text(text) => {
            let text = InGuest::new(text, store);
            attribute(&key, RawValue::Text(&text), allowance)
        }
        WireValue::Integer(number) => attribute(&key, RawValue::Integer(*number), allowance),
        WireValue::Float(number) => attribute(&key, RawValue::Float(*number), allowance),
        WireValue::Boolean(flag) => attribute(&key, RawValue::Boolean(*flag), allowance),
    }
}

#[cfg(test)]
mod tests {
    use std::cell::Cell;

    use super::*;

    /// A string that counts how often it is read.
    struct Counted<'a> {
        text: &'a str,
        reads: &'a Cell<u32>,
    }

    impl RawText for Counted<'_> {
        fn read(&self) -> wasmtime::Result<Cow<'_, str>> {
            self.reads.set(self.reads.get() + 1);
            Ok(Cow::Borrowed(self.text))
        }
    }

    fn allowance(bytes: usize, attributes: u32) -> Allowance {
        Allowance { bytes, attributes }
    }

    /// [`attributes`] of `count` copies of one text attribute.
    fn repeated(count: usize, key: &str, value: &str, left: &mut Allowance) -> Lifted {
        attributes(count, left, |_, left| {
            attribute(&key, RawValue::Text(&value), left)
        })
        .unwrap()
    }

    #[test]
    fn a_text_that_fits_is_cut_to_the_longest_value_and_spends_what_is_kept() {
        let long = "é".repeat(MAX_VALUE_BYTES);
        let mut left = allowance(1 << 20, 0);
        let kept = text(&long.as_str(), &mut left).unwrap().unwrap();
        assert_eq!(kept.len(), MAX_VALUE_BYTES);
        assert!(long.starts_with(&kept));
        assert_eq!(left.bytes, (1 << 20) - MAX_VALUE_BYTES);
    }

    #[test]
    fn a_text_longer_than_what_is_left_is_dropped_and_spends_the_rest() {
        let mut left = allowance(10, 0);
        assert_eq!(text(&"0123456789a", &mut left).unwrap(), None);
        assert_eq!(left.bytes, 0);
    }

    #[test]
    fn with_no_bytes_left_a_text_is_never_read() {
        let reads = Cell::new(0);
        let raw = Counted {
            text: "x",
            reads: &reads,
        };
        assert_eq!(text(&raw, &mut allowance(0, 10)).unwrap(), None);
        let mut none_left = allowance(100, 0);
        let value = RawValue::Text(&raw);
        assert_eq!(attribute(&raw, value, &mut none_left).unwrap(), None);
        assert_eq!(reads.get(), 0);
    }

    #[test]
    fn attributes_past_the_count_are_dropped_unread() {
        let mut left = allowance(1 << 20, 4);
        let lifted = repeated(10, "k", "v", &mut left);
        assert_eq!(lifted.attributes.len(), 4);
        assert_eq!(lifted.dropped, 6);
        assert_eq!(left.attributes, 0);
    }

    #[test]
    fn attributes_past_the_bytes_are_dropped_and_the_first_misfit_ends_the_reading() {
        let large = "x".repeat(MAX_VALUE_BYTES);
        let budget = 256 * 1024;
        let mut left = allowance(budget, 1024);
        let lifted = repeated(100, "key", &large, &mut left);
        assert_eq!(lifted.attributes.len(), budget / (MAX_VALUE_BYTES + 3));
        assert_eq!(lifted.dropped, 100 - lifted.attributes.len() as u64);
        assert_eq!(left.bytes, 0);
    }

    #[test]
    fn no_attribute_is_fetched_past_the_count_or_the_first_misfit() {
        let one = || Attribute {
            key: "k".into(),
            value: Value::Boolean(true),
        };
        let mut fetched = 0;
        let lifted = attributes(1_000, &mut allowance(100, 3), |_, _| {
            fetched += 1;
            Ok(Some(one()))
        })
        .unwrap();
        assert_eq!(
            (fetched, lifted.attributes.len(), lifted.dropped),
            (3, 3, 997)
        );
        fetched = 0;
        let lifted = attributes(1_000, &mut allowance(100, 1_000), |index, _| {
            fetched += 1;
            Ok((index < 2).then(one))
        })
        .unwrap();
        assert_eq!(
            (fetched, lifted.attributes.len(), lifted.dropped),
            (3, 2, 998)
        );
        fetched = 0;
        let lifted = attributes(5, &mut allowance(0, 1_000), |_, _| {
            fetched += 1;
            Ok(Some(one()))
        })
        .unwrap();
        assert_eq!((fetched, lifted.dropped), (0, 5));
    }

    #[test]
    fn a_number_counts_eight_bytes() {
        let mut left = allowance(11, 2);
        let lifted = attribute(&"k", RawValue::Integer(7), &mut left).unwrap();
        assert_eq!(
            lifted,
            Some(Attribute {
                key: "k".into(),
                value: Value::Integer(7)
            })
        );
        assert_eq!(left, allowance(2, 1));
        assert_eq!(
            attribute(&"k", RawValue::Boolean(true), &mut left).unwrap(),
            None
        );
        assert_eq!(left.bytes, 0);
    }

    #[test]
    fn a_metered_text_spends_its_length_and_one_over_its_limit_spends_everything() {
        let mut allowance = Allowance {
            bytes: 10,
            attributes: 0,
        };
        let read =
            |text: &str, allowance: &mut Allowance| metered_text(&text, 4, allowance).unwrap();
        assert_eq!(read("abcd", &mut allowance).as_deref(), Some("abcd"));
        assert_eq!(allowance.bytes, 6);
        assert_eq!(read("abcde", &mut allowance), None);
        assert_eq!(allowance.bytes, 0);
        assert_eq!(read("ab", &mut allowance), None);
    }

    #[test]
    fn a_metered_text_is_not_read_once_the_allowance_is_spent() {
        struct MustNotRead;
        impl RawText for MustNotRead {
            fn read(&self) -> wasmtime::Result<Cow<'_, str>> {
                panic!("a string past the allowance was read");
            }
        }
        let mut spent = Allowance {
            bytes: 0,
            attributes: 0,
        };
        assert_eq!(metered_text(&MustNotRead, 4, &mut spent).unwrap(), None);
    }

    #[test]
    fn a_metered_text_longer_than_what_is_left_is_dropped() {
        let mut allowance = Allowance {
            bytes: 3,
            attributes: 0,
        };
        assert_eq!(metered_text(&"abcd", 4, &mut allowance).unwrap(), None);
        assert_eq!(allowance.bytes, 0);
    }

    #[test]
    fn a_bounded_text_over_its_limit_is_not_copied() {
        assert_eq!(bounded_text(&"abcd", 4).unwrap().as_deref(), Some("abcd"));
        assert_eq!(bounded_text(&"abcde", 4).unwrap(), None);
    }
}
