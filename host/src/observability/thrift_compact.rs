//! Thrift's compact protocol, as much of it as a Jaeger agent's `emitBatch` call needs: a
//! one-way message, structs, lists of structs, and fields of 32- and 64-bit integers, doubles,
//! booleans and strings.
//!
//! Why not the `thrift` crate's `TCompactOutputProtocol`, which this replaced: it writes each
//! byte through `io::Write`, and each field head through a `TFieldIdentifier` that owns its name.
//! A request's span took about 10,000 instructions to encode that way, 4 % of a request with the
//! real guest (bench/PROFILE.md, section 19). The tests check these bytes against that crate's
//! protocol, and the integration tests decode every datagram with it.
//!
//! Each method takes the name the Thrift file gives the struct or field, so a call reads like the
//! file; the compact protocol never writes a name, and neither does this.

/// A field's or a list element's type, as the compact protocol's four-bit code. A boolean
/// field carries its value in its type (see [`CompactWriter::bool_field`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CompactType {
    /// A 32-bit integer (`i32`), a zigzag varint.
    I32 = 5,
    /// A 64-bit integer (`i64`), a zigzag varint.
    I64 = 6,
    /// A `double`, eight bytes little-endian.
    Double = 7,
    /// A `string` or `binary`: its length, then its bytes.
    Binary = 8,
    /// A `list`: its head, then its elements.
    List = 9,
    /// A `struct`: its fields, then a stop byte.
    Struct = 12,
}

/// The type code of a boolean field that is true.
const BOOL_TRUE: u8 = 1;
/// The type code of a boolean field that is false.
const BOOL_FALSE: u8 = 2;

/// The first byte of a compact-protocol message.
const PROTOCOL_ID: u8 = 0x82;
/// The protocol's version, in the low five bits of a message's second byte.
const VERSION: u8 = 1;

/// The message type of a one-way call (`TMessageType::OneWay`), which expects no reply.
const ONE_WAY: u8 = 4;

/// Bytes of the compact protocol, written into a buffer in memory (writing cannot fail).
///
/// Field ids are written as the difference from the struct's previous field, as the protocol
/// does: the writer keeps that id for each struct it is inside.
#[derive(Debug, Default)]
pub struct CompactWriter {
    bytes: Vec<u8>,
    /// The id of the last field written in the innermost open struct (0 before the first).
    last_field: i16,
    /// The same, of each struct around it.
    outer_fields: Vec<i16>,
}

impl CompactWriter {
    /// A writer with room for `capacity` bytes before it grows.
    pub fn with_capacity(capacity: usize) -> CompactWriter {
        CompactWriter {
            bytes: Vec::with_capacity(capacity),
            ..CompactWriter::default()
        }
    }

    /// The bytes written.
    pub fn into_bytes(self) -> Vec<u8> {
        self.bytes
    }

    /// The head of a one-way call of `method`, numbered `sequence`; its arguments follow as one
    /// struct.
    pub fn one_way_message(&mut self, method: &str, sequence: i32) {
        self.bytes.push(PROTOCOL_ID);
        self.bytes.push((ONE_WAY << 5) | VERSION);
        self.varint(u64::from(sequence as u32));
        self.binary(method.as_bytes());
    }

    /// Opens a struct: its fields follow, then [`CompactWriter::struct_end`]. `_name` is the
    /// struct's name in the Thrift file, which the protocol does not write.
    pub fn struct_begin(&mut self, _name: &str) {
        self.outer_fields.push(self.last_field);
        self.last_field = 0;
    }

    /// Closes the innermost struct: its stop byte.
    pub fn struct_end(&mut self) {
        debug_assert!(!self.outer_fields.is_empty(), "a struct closed twice");
        self.bytes.push(0);
        self.last_field = self.outer_fields.pop().unwrap_or(0);
    }

    /// A struct field `id`, opened; close it with [`CompactWriter::struct_end`].
    pub fn struct_field(&mut self, name: &str, id: i16) {
        self.field_head(id, CompactType::Struct as u8);
        self.struct_begin(name);
    }

    /// A struct field `id` whose struct was encoded apart, by a writer of its own: its fields and
    /// its stop byte.
    pub fn encoded_struct_field(&mut self, _name: &str, id: i16, encoded: &[u8]) {
        self.field_head(id, CompactType::Struct as u8);
        self.bytes.extend_from_slice(encoded);
    }

    /// A list field `id` of `count` elements of type `element`, which follow.
    pub fn list_field(&mut self, _name: &str, id: i16, element: CompactType, count: usize) {
        self.field_head(id, CompactType::List as u8);
        self.list_head(element, count);
    }

    /// The head of a list of `count` elements of type `element`, which follow.
    pub fn list_head(&mut self, element: CompactType, count: usize) {
        // A count no datagram could hold is written as the largest: the span is then too large
        // to send, and dropped as such.
        let count = u32::try_from(count).unwrap_or(u32::MAX);
        if count < 15 {
            self.bytes.push(((count as u8) << 4) | element as u8);
        } else {
            self.bytes.push(0xF0 | element as u8);
            self.varint(u64::from(count));
        }
    }

    /// A string field.
    pub fn string_field(&mut self, _name: &str, id: i16, value: &str) {
        self.field_head(id, CompactType::Binary as u8);
        self.binary(value.as_bytes());
    }

    /// A 32-bit integer field.
    pub fn i32_field(&mut self, _name: &str, id: i16, value: i32) {
        self.field_head(id, CompactType::I32 as u8);
        self.varint(u64::from(zigzag32(value)));
    }

    /// A 64-bit integer field.
    pub fn i64_field(&mut self, _name: &str, id: i16, value: i64) {
        self.field_head(id, CompactType::I64 as u8);
        self.varint(zigzag64(value));
    }

    /// A double field: its IEEE 754 bits, little-endian.
    pub fn double_field(&mut self, _name: &str, id: i16, value: f64) {
        self.field_head(id, CompactType::Double as u8);
        self.bytes.extend_from_slice(&value.to_le_bytes());
    }

    /// A boolean field: its value is its type code, and nothing follows.
    pub fn bool_field(&mut self, _name: &str, id: i16, value: bool) {
        self.field_head(id, if value { BOOL_TRUE } else { BOOL_FALSE });
    }

    /// A field's head: one byte when its id follows the previous field's by 1 to 14, else the
    /// type, then the id as a zigzag varint. (The protocol allows the short form for 15 too;
    /// the `thrift` crate does not use it, and neither does this, so the bytes are the same.)
    fn field_head(&mut self, id: i16, type_code: u8) {
        let delta = i32::from(id) - i32::from(self.last_field);
        if (1..15).contains(&delta) {
            self.bytes.push(((delta as u8) << 4) | type_code);
        } else {
            self.bytes.push(type_code);
            self.varint(u64::from(zigzag32(i32::from(id))));
        }
        self.last_field = id;
    }

    /// Bytes with their length before them.
    fn binary(&mut self, bytes: &[u8]) {
        // The protocol's lengths are 32-bit. A longer value cannot be sent anyway: the exporter
        // measures each encoded span against a datagram's 65,000 bytes and drops it whole.
        self.varint(bytes.len() as u64);
        self.bytes.extend_from_slice(bytes);
    }

    /// An unsigned integer in seven-bit groups, least significant first, the high bit of each
    /// byte saying that another follows.
    fn varint(&mut self, mut value: u64) {
        while value >= 0x80 {
            self.bytes.push((value as u8) | 0x80);
            value >>= 7;
        }
        self.bytes.push(value as u8);
    }
}

/// A signed 32-bit integer mapped to an unsigned one, small magnitudes to small numbers.
fn zigzag32(value: i32) -> u32 {
    ((value << 1) ^ (value >> 31)) as u32
}

/// A signed 64-bit integer mapped to an unsigned one, small magnitudes to small numbers.
fn zigzag64(value: i64) -> u64 {
    ((value << 1) ^ (value >> 63)) as u64
}

#[cfg(test)]
mod tests {
    use thrift::protocol::{
        TCompactOutputProtocol, TFieldIdentifier, TListIdentifier, TMessageIdentifier,
        TMessageType, TOutputProtocol, TStructIdentifier, TType,
    };

    use super::*;

    /// What the `thrift` crate's compact protocol writes.
    fn theirs(write: impl FnOnce(&mut TCompactOutputProtocol<&mut Vec<u8>>)) -> Vec<u8> {
        let mut bytes = Vec::new();
        write(&mut TCompactOutputProtocol::new(&mut bytes));
        bytes
    }

    fn field(id: i16, field_type: TType) -> TFieldIdentifier {
        TFieldIdentifier::new::<Option<String>, String, i16>(None, field_type, id)
    }

    #[test]
    fn integers_of_every_size_and_sign_are_written_as_the_thrift_crate_writes_them() {
        let values: [i64; 12] = [
            0,
            1,
            -1,
            63,
            -64,
            64,
            300,
            -300,
            i64::from(i32::MAX),
            i64::from(i32::MIN),
            i64::MAX,
            i64::MIN,
        ];
        for value in values {
            let mut ours = CompactWriter::default();
            ours.struct_begin("S");
            ours.i64_field("a", 1, value);
            if let Ok(small) = i32::try_from(value) {
                ours.i32_field("b", 2, small);
            }
            ours.struct_end();
            let expected = theirs(|protocol| {
                protocol
                    .write_struct_begin(&TStructIdentifier::new("S"))
                    .unwrap();
                protocol.write_field_begin(&field(1, TType::I64)).unwrap();
                protocol.write_i64(value).unwrap();
                protocol.write_field_end().unwrap();
                if let Ok(small) = i32::try_from(value) {
                    protocol.write_field_begin(&field(2, TType::I32)).unwrap();
                    protocol.write_i32(small).unwrap();
                    protocol.write_field_end().unwrap();
                }
                protocol.write_field_stop().unwrap();
                protocol.write_struct_end().unwrap();
            });
            assert_eq!(ours.into_bytes(), expected, "{value}");
        }
    }

    #[test]
    fn field_ids_15_or_more_apart_or_going_back_are_written_in_the_long_form() {
        let mut ours = CompactWriter::default();
        ours.struct_begin("S");
        ours.string_field("a", 2, "x");
        ours.i32_field("b", 40, 7);
        ours.double_field("c", 3, -2.5);
        ours.bool_field("d", 4, true);
        ours.bool_field("e", 300, false);
        ours.i32_field("f", 314, 1);
        ours.i32_field("g", 329, 2);
        ours.struct_end();
        let expected = theirs(|protocol| {
            protocol
                .write_struct_begin(&TStructIdentifier::new("S"))
                .unwrap();
            protocol
                .write_field_begin(&field(2, TType::String))
                .unwrap();
            protocol.write_string("x").unwrap();
            protocol.write_field_end().unwrap();
            protocol.write_field_begin(&field(40, TType::I32)).unwrap();
            protocol.write_i32(7).unwrap();
            protocol.write_field_end().unwrap();
            protocol
                .write_field_begin(&field(3, TType::Double))
                .unwrap();
            protocol.write_double(-2.5).unwrap();
            protocol.write_field_end().unwrap();
            protocol.write_field_begin(&field(4, TType::Bool)).unwrap();
            protocol.write_bool(true).unwrap();
            protocol.write_field_end().unwrap();
            protocol
                .write_field_begin(&field(300, TType::Bool))
                .unwrap();
            protocol.write_bool(false).unwrap();
            protocol.write_field_end().unwrap();
            // Deltas of 14 (the longest short form) and 15 (long, as the crate writes it).
            protocol.write_field_begin(&field(314, TType::I32)).unwrap();
            protocol.write_i32(1).unwrap();
            protocol.write_field_end().unwrap();
            protocol.write_field_begin(&field(329, TType::I32)).unwrap();
            protocol.write_i32(2).unwrap();
            protocol.write_field_end().unwrap();
            protocol.write_field_stop().unwrap();
            protocol.write_struct_end().unwrap();
        });
        assert_eq!(ours.into_bytes(), expected);
    }

    #[test]
    fn a_message_with_nested_structs_and_lists_short_and_long_is_written_as_the_thrift_crate_writes_it()
     {
        let long = "y".repeat(200);
        for count in [0, 1, 14, 15, 300] {
            let mut ours = CompactWriter::default();
            ours.one_way_message("emitBatch", 70_000);
            ours.struct_begin("args");
            ours.struct_field("batch", 1);
            ours.list_field("spans", 2, CompactType::Struct, count);
            for n in 0..count {
                ours.struct_begin("Span");
                ours.i64_field("id", 1, n as i64);
                ours.string_field("name", 5, &long);
                ours.struct_end();
            }
            ours.struct_end();
            ours.i32_field("after", 2, 9);
            ours.struct_end();
            let expected = theirs(|protocol| {
                protocol
                    .write_message_begin(&TMessageIdentifier::new(
                        "emitBatch",
                        TMessageType::OneWay,
                        70_000,
                    ))
                    .unwrap();
                protocol
                    .write_struct_begin(&TStructIdentifier::new("args"))
                    .unwrap();
                protocol
                    .write_field_begin(&field(1, TType::Struct))
                    .unwrap();
                protocol
                    .write_struct_begin(&TStructIdentifier::new("Batch"))
                    .unwrap();
                protocol.write_field_begin(&field(2, TType::List)).unwrap();
                protocol
                    .write_list_begin(&TListIdentifier::new(TType::Struct, count as i32))
                    .unwrap();
                for n in 0..count {
                    protocol
                        .write_struct_begin(&TStructIdentifier::new("Span"))
                        .unwrap();
                    protocol.write_field_begin(&field(1, TType::I64)).unwrap();
                    protocol.write_i64(n as i64).unwrap();
                    protocol.write_field_end().unwrap();
                    protocol
                        .write_field_begin(&field(5, TType::String))
                        .unwrap();
                    protocol.write_string(&long).unwrap();
                    protocol.write_field_end().unwrap();
                    protocol.write_field_stop().unwrap();
                    protocol.write_struct_end().unwrap();
                }
                protocol.write_list_end().unwrap();
                protocol.write_field_end().unwrap();
                protocol.write_field_stop().unwrap();
                protocol.write_struct_end().unwrap();
                protocol.write_field_end().unwrap();
                protocol.write_field_begin(&field(2, TType::I32)).unwrap();
                protocol.write_i32(9).unwrap();
                protocol.write_field_end().unwrap();
                protocol.write_field_stop().unwrap();
                protocol.write_struct_end().unwrap();
                protocol.write_message_end().unwrap();
            });
            assert_eq!(ours.into_bytes(), expected, "{count} spans");
        }
    }
}
