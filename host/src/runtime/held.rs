//! What a guest's handles make the host hold, charged to the host-wide memory budget.
//!
//! A guest can make objects on the host's side without growing its own memory: `wasi:http`
//! header maps, outgoing requests and responses with their buffered body chunks, streams,
//! pollables, spans. Each lives in the request's resource table until the guest drops it or the
//! instance ends. After every host call the table's objects are weighed ([`HeldObjects::settle`]),
//! each by the most its kind can hold under this host's caps ([`weight`]), and the sum is taken
//! from the same [`MemoryBudget`] as linear memory, within a limit of the instance's own. Past
//! either the call traps with [`TooMuchHeld`]: past the instance's limit the request is answered
//! 500 (the guest's fault, as past its own memory limit), past the budget 503. So a guest holds
//! on the host's side at most what it was granted and what its last call made.

use std::any::{Any, TypeId};
use std::sync::Arc;

use http::{HeaderMap, HeaderName, HeaderValue};
use wasmtime::component::ResourceTable;
use wasmtime_wasi_http::p2::bindings::http::types::Method;
use wasmtime_wasi_http::p2::body::{HostFutureTrailers, HostIncomingBody, HostOutgoingBody};
use wasmtime_wasi_http::p2::types::{
    HostFutureIncomingResponse, HostIncomingRequest, HostIncomingResponse, HostOutgoingRequest,
    HostOutgoingResponse,
};
use wasmtime_wasi_http::{FieldMap, p3};

use crate::runtime::outbound::MAX_RESPONSE_HEAD_BYTES;
use crate::runtime::pool::MemoryBudget;

/// The most a guest's header map (`fields`) may hold, as wasmtime-wasi-http counts it (names
/// and values with their in-memory heads): far above what a response's headers need, and half
/// the crate's default, so that each map weighs less.
pub const FIELDS_LIMIT_BYTES: usize = 64 << 10;
/// What a header map holds per slot it has room for beyond the bytes wasmtime-wasi-http counts:
/// the slot's hash, links and index, and, as a map grows by doubling, a spare slot.
const MAP_SLOT_BYTES: usize = 2 * (size_of::<HeaderName>() + size_of::<HeaderValue>() + 32);
/// What a header map holds per value beyond the bytes counted: the allocator's share of its
/// name and value, and the links of a value appended under a name already there, doubled.
const MAP_VALUE_BYTES: usize = 2 * (size_of::<HeaderValue>() + 32) + 32;
/// The most one write into an outgoing body's stream may carry.
pub const BODY_CHUNK_BYTES: usize = 16 << 10;
/// Written chunks an outgoing body buffers beyond the one its reader may be taking: with that
/// one, a body holds at most [`BODY_BUFFER_BYTES`].
pub const BODY_BUFFER_CHUNKS: usize = 1;
/// What an outgoing body's channel holds at most: wasmtime-wasi-http's channel takes one chunk
/// more than [`BODY_BUFFER_CHUNKS`].
pub const BODY_BUFFER_BYTES: usize = (BODY_BUFFER_CHUNKS + 1) * BODY_CHUNK_BYTES;
/// What a body the guest reads holds at most: a client's, chunks of [`BODY_CHUNK_BYTES`]; an
/// outgoing call's answer, a frame of the connection's read buffer, which
/// [`MAX_RESPONSE_HEAD_BYTES`] bounds as it bounds the answer's head.
const INCOMING_BODY_BYTES: usize = if MAX_RESPONSE_HEAD_BYTES > BODY_BUFFER_BYTES {
    MAX_RESPONSE_HEAD_BYTES
} else {
    BODY_BUFFER_BYTES
};
/// What any other object weighs: its table entry, its box and what it points at (a pollable, a
/// stream over bytes already counted elsewhere, an error, a span within its own quotas).
pub const OTHER_OBJECT_BYTES: usize = 1 << 10;

/// The trap of a host call after which the guest's objects would hold more than it may.
#[derive(Debug)]
pub struct TooMuchHeld {
    /// What the objects would hold, in bytes.
    held: usize,
    /// How many objects there are.
    objects: usize,
    /// The instance's own limit, in bytes, when that is what they are past; `None` when the
    /// host-wide budget has not that much left.
    over_limit: Option<usize>,
}

impl TooMuchHeld {
    /// Whether the host-wide budget, not the instance's own limit, refused: the host is busy.
    pub fn by_budget(&self) -> bool {
        self.over_limit.is_none()
    }
}

impl std::fmt::Display for TooMuchHeld {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "the guest's {} wasi:http and other host objects would hold {} KiB, ",
            self.objects,
            self.held >> 10
        )?;
        match self.over_limit {
            Some(limit) => write!(f, "past the instance's limit of {} KiB", limit >> 10),
            None => f.write_str("more than the guest memory budget has left"),
        }
    }
}

impl std::error::Error for TooMuchHeld {}

/// One request's account of what its objects hold, and the part of the budget it has taken.
pub struct HeldObjects {
    budget: Arc<MemoryBudget>,
    /// The most this instance's objects may hold, whatever the budget has left.
    limit: usize,
    /// What one header map may hold in this request: the larger of [`FIELDS_LIMIT_BYTES`] and
    /// the client's own headers, which a guest may copy into a map of its own.
    fields_bytes: usize,
    /// Bytes taken from the budget now.
    charged: usize,
}

impl HeldObjects {
    /// An empty account on `budget`, at most `limit` bytes, for a request whose client sent
    /// `headers`.
    pub fn new(budget: Arc<MemoryBudget>, limit: usize, headers: &HeaderMap) -> HeldObjects {
        HeldObjects {
            budget,
            limit,
            fields_bytes: FIELDS_LIMIT_BYTES.max(fields_bytes(headers)),
            charged: 0,
        }
    }

    /// Weighs the objects in `table` and takes from the budget, or gives back, the difference
    /// with what was charged; fails past the instance's limit or when the budget cannot give it.
    pub fn settle(&mut self, table: &mut ResourceTable) -> Result<(), TooMuchHeld> {
        let (mut held, mut objects) = (0, 0);
        for object in table.iter_mut() {
            held += weight(&*object, self.fields_bytes);
            objects += 1;
        }
        let too_much = |over_limit| TooMuchHeld {
            held,
            objects,
            over_limit,
        };
        if held > self.limit {
            return Err(too_much(Some(self.limit)));
        }
        // Most host calls change nothing the account weighs: the budget's counter, shared by
        // every thread, is left alone then.
        if held > self.charged {
            if !self.budget.commit(held - self.charged) {
                return Err(too_much(None));
            }
        } else if held < self.charged {
            self.budget.release(self.charged - held);
        }
        self.charged = held;
        Ok(())
    }

    /// Bytes this request's objects hold of the budget now.
    pub fn charged(&self) -> usize {
        self.charged
    }
}

impl Drop for HeldObjects {
    fn drop(&mut self) {
        self.budget.release(self.charged);
    }
}

/// The most `object` can make the host hold, where the names and values of one header map
/// count at most `fields_bytes`: a header map those bytes and its slots; an outgoing request or
/// response its headers, its body's buffered chunks, the trailers its finished body may hold
/// and its own strings; an outgoing body those chunks again (its stream may outlive the message
/// that reads them); an outgoing call's answer, or its future once ready, its head and a frame
/// of its body.
fn weight(object: &(dyn Any + Send), fields_bytes: usize) -> usize {
    // One `type_id` call, compared with each kind's: most objects are of none of them, and a
    // chain of downcasts would ask each object its type once per kind.
    let kind = (*object).type_id();
    let is = |of: TypeId| kind == of;
    if is(TypeId::of::<FieldMap>()) {
        object
            .downcast_ref::<FieldMap>()
            .map_or(0, |map| map_weight(map, fields_bytes))
    } else if is(TypeId::of::<HostOutgoingRequest>()) {
        object
            .downcast_ref::<HostOutgoingRequest>()
            .map_or(0, |request| outgoing_request_weight(request, fields_bytes))
    } else if is(TypeId::of::<HostOutgoingResponse>()) {
        object
            .downcast_ref::<HostOutgoingResponse>()
            .map_or(0, |response| {
                map_weight(&response.headers, fields_bytes)
                    + body_weight(response.body.is_some(), fields_bytes)
            })
    } else if is(TypeId::of::<HostOutgoingBody>()) {
        BODY_BUFFER_BYTES
    } else if is(TypeId::of::<HostIncomingBody>()) {
        INCOMING_BODY_BYTES
    } else if is(TypeId::of::<HostIncomingResponse>()) {
        object
            .downcast_ref::<HostIncomingResponse>()
            .map_or(0, |response| {
                map_weight(&response.headers, MAX_RESPONSE_HEAD_BYTES)
                    + response.body.as_ref().map_or(0, |_| INCOMING_BODY_BYTES)
            })
    } else if is(TypeId::of::<HostFutureIncomingResponse>()) {
        match object.downcast_ref::<HostFutureIncomingResponse>() {
            Some(HostFutureIncomingResponse::Ready(Ok((response, _)))) => {
                map_weight(response.headers(), MAX_RESPONSE_HEAD_BYTES) + INCOMING_BODY_BYTES
            }
            // Its connection reads the answer's head meanwhile.
            Some(HostFutureIncomingResponse::Pending(_)) => MAX_RESPONSE_HEAD_BYTES,
            _ => OTHER_OBJECT_BYTES,
        }
    } else if is(TypeId::of::<HostFutureTrailers>()) {
        match object.downcast_ref::<HostFutureTrailers>() {
            Some(HostFutureTrailers::Waiting(_)) => INCOMING_BODY_BYTES,
            Some(HostFutureTrailers::Done(Ok(Some(trailers)))) => {
                map_weight(trailers, MAX_RESPONSE_HEAD_BYTES)
            }
            _ => OTHER_OBJECT_BYTES,
        }
    } else if is(TypeId::of::<HostIncomingRequest>()) {
        // A client's request, which a reused instance may keep: its headers (their map's shape
        // private to wasmtime-wasi-http; the edge's head bound keeps its slots within as much
        // again), and its body's chunk in flight.
        2 * fields_bytes + BODY_BUFFER_BYTES
    } else if is(TypeId::of::<p3::Request>()) {
        object
            .downcast_ref::<p3::Request>()
            .map_or(0, |request| p3_request_weight(request, fields_bytes))
    } else if is(TypeId::of::<p3::Response>()) {
        // The guest's own, or an outgoing call's answer.
        object.downcast_ref::<p3::Response>().map_or(0, |response| {
            map_weight(&response.headers, fields_bytes.max(MAX_RESPONSE_HEAD_BYTES))
                + INCOMING_BODY_BYTES
        })
    } else {
        OTHER_OBJECT_BYTES
    }
}

/// An outgoing request: its headers, its body once taken, and its own strings.
fn outgoing_request_weight(request: &HostOutgoingRequest, fields_bytes: usize) -> usize {
    let method = match &request.method {
        Method::Other(text) => text.len(),
        _ => 0,
    };
    let strings = method
        + request.authority.as_ref().map_or(0, String::len)
        + request.path_with_query.as_ref().map_or(0, String::len);
    map_weight(&request.headers, fields_bytes)
        + body_weight(request.body.is_some(), fields_bytes)
        + strings
}

/// A WASIp3 request: it holds its headers and strings itself, and its body's chunk in flight.
fn p3_request_weight(request: &p3::Request, fields_bytes: usize) -> usize {
    let strings = request.method.as_str().len()
        + request
            .authority
            .as_ref()
            .map_or(0, |authority| authority.as_str().len())
        + request
            .path_with_query
            .as_ref()
            .map_or(0, |path| path.as_str().len());
    map_weight(&request.headers, fields_bytes) + BODY_BUFFER_BYTES + strings
}

/// What a header map holds at most, its names and values counting at most `fields_bytes`.
fn map_weight(map: &HeaderMap, fields_bytes: usize) -> usize {
    fields_bytes + map.capacity() * MAP_SLOT_BYTES + map.len() * MAP_VALUE_BYTES
}

/// What a message's body holds once taken: its buffered chunks, and the trailers it is finished
/// with, a map taken out of the table whose shape is no longer seen (weighed as one of the
/// smallest headers, each costing several times the bytes counted for it).
fn body_weight(taken: bool, fields_bytes: usize) -> usize {
    if taken {
        BODY_BUFFER_BYTES + 4 * fields_bytes
    } else {
        0
    }
}

/// What `headers` weigh as a header map, as wasmtime-wasi-http counts a map's size.
fn fields_bytes(headers: &HeaderMap) -> usize {
    let names: usize = headers
        .keys()
        .map(|name| name.as_str().len() + size_of::<HeaderName>())
        .sum();
    let values: usize = headers
        .values()
        .map(|value| value.len() + size_of::<HeaderValue>())
        .sum();
    names + values
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table_with(objects: usize) -> ResourceTable {
        let mut table = ResourceTable::new();
        for _ in 0..objects {
            table
                .push(FieldMap::new_mutable(FIELDS_LIMIT_BYTES))
                .unwrap();
        }
        table
    }

    #[test]
    fn each_header_map_is_charged_its_limit_and_given_back_when_dropped() {
        let budget = Arc::new(MemoryBudget::new(1 << 30));
        let mut held = HeldObjects::new(Arc::clone(&budget), usize::MAX, &HeaderMap::new());
        let mut table = table_with(3);
        held.settle(&mut table).unwrap();
        assert_eq!(budget.committed(), 3 * FIELDS_LIMIT_BYTES);
        let mut table = table_with(1);
        held.settle(&mut table).unwrap();
        assert_eq!(budget.committed(), FIELDS_LIMIT_BYTES);
        drop(held);
        assert_eq!(budget.committed(), 0);
    }

    #[test]
    fn objects_past_the_budget_fail_the_call_and_take_nothing_more() {
        let budget = Arc::new(MemoryBudget::new(10 * FIELDS_LIMIT_BYTES));
        let mut held = HeldObjects::new(Arc::clone(&budget), usize::MAX, &HeaderMap::new());
        held.settle(&mut table_with(10)).unwrap();
        let refused = held.settle(&mut table_with(11)).unwrap_err();
        assert_eq!(refused.objects, 11);
        assert!(refused.by_budget());
        assert!(refused.to_string().contains("11 wasi:http"), "{refused}");
        assert_eq!(held.charged(), 10 * FIELDS_LIMIT_BYTES);
        assert_eq!(budget.committed(), 10 * FIELDS_LIMIT_BYTES);
    }

    #[test]
    fn objects_past_the_instances_own_limit_fail_the_call_whatever_the_budget() {
        let budget = Arc::new(MemoryBudget::new(1 << 30));
        let limit = 4 * FIELDS_LIMIT_BYTES;
        let mut held = HeldObjects::new(Arc::clone(&budget), limit, &HeaderMap::new());
        held.settle(&mut table_with(4)).unwrap();
        let refused = held.settle(&mut table_with(5)).unwrap_err();
        assert!(!refused.by_budget());
        assert!(
            refused.to_string().contains("instance's limit"),
            "{refused}"
        );
        assert_eq!(budget.committed(), limit);
    }

    #[test]
    fn a_map_weighs_as_much_as_the_clients_headers_a_guest_could_copy() {
        let mut headers = HeaderMap::new();
        for i in 0..100 {
            let name = HeaderName::try_from(format!("x-long-{i}")).unwrap();
            headers.insert(name, HeaderValue::from_str(&"v".repeat(1000)).unwrap());
        }
        let budget = Arc::new(MemoryBudget::new(1 << 30));
        let mut held = HeldObjects::new(Arc::clone(&budget), usize::MAX, &headers);
        held.settle(&mut table_with(1)).unwrap();
        assert!(held.charged() > 100_000, "{}", held.charged());
        assert_eq!(held.charged(), fields_bytes(&headers));
    }

    #[test]
    fn a_message_weighs_its_headers_its_body_and_its_strings() {
        let request = |authority: usize| HostOutgoingRequest {
            method: Method::Get,
            scheme: None,
            authority: Some("a".repeat(authority)),
            path_with_query: None,
            headers: FieldMap::default(),
            body: None,
        };
        let bare = weight(&request(0), FIELDS_LIMIT_BYTES);
        assert_eq!(bare, FIELDS_LIMIT_BYTES);
        assert_eq!(
            weight(&request(1 << 20), FIELDS_LIMIT_BYTES),
            bare + (1 << 20)
        );
        let mut with_body = request(0);
        with_body.body = Some({
            use http_body_util::BodyExt;
            http_body_util::Empty::<bytes::Bytes>::new()
                .map_err(|never| match never {})
                .boxed_unsync()
        });
        assert_eq!(
            weight(&with_body, FIELDS_LIMIT_BYTES),
            bare + BODY_BUFFER_BYTES + 4 * FIELDS_LIMIT_BYTES
        );
        assert_eq!(weight(&7_u32, FIELDS_LIMIT_BYTES), OTHER_OBJECT_BYTES);
    }

    fn empty_body() -> wasmtime_wasi_http::p2::body::HyperIncomingBody {
        use http_body_util::BodyExt;
        http_body_util::Empty::<bytes::Bytes>::new()
            .map_err(|never| match never {})
            .boxed_unsync()
    }

    #[tokio::test]
    async fn an_outgoing_calls_answer_weighs_its_head_and_a_frame_of_its_body_ready_or_taken() {
        let head = MAX_RESPONSE_HEAD_BYTES;
        let answer = |body: Option<HostIncomingBody>| HostIncomingResponse {
            status: 200,
            headers: FieldMap::default(),
            body,
        };
        assert_eq!(weight(&answer(None), FIELDS_LIMIT_BYTES), head);
        let with_body = answer(Some(HostIncomingBody::new(empty_body())));
        assert_eq!(
            weight(&with_body, FIELDS_LIMIT_BYTES),
            head + INCOMING_BODY_BYTES
        );
        let worker = wasmtime_wasi::runtime::spawn(async {});
        let ready =
            HostFutureIncomingResponse::Ready(Ok((http::Response::new(empty_body()), worker)));
        assert_eq!(
            weight(&ready, FIELDS_LIMIT_BYTES),
            head + INCOMING_BODY_BYTES
        );
        let pending = HostFutureIncomingResponse::Pending(wasmtime_wasi::runtime::spawn(
            std::future::pending(),
        ));
        assert_eq!(weight(&pending, FIELDS_LIMIT_BYTES), head);
        let trailers = HostFutureTrailers::Waiting(HostIncomingBody::new(empty_body()));
        assert_eq!(weight(&trailers, FIELDS_LIMIT_BYTES), INCOMING_BODY_BYTES);
    }

    #[test]
    fn a_map_of_many_small_headers_weighs_its_slots_and_values_too() {
        let mut map = HeaderMap::new();
        let empty = map_weight(&map, FIELDS_LIMIT_BYTES);
        assert_eq!(empty, FIELDS_LIMIT_BYTES);
        for i in 0..500 {
            let name = HeaderName::try_from(format!("x-{i}")).unwrap();
            map.append(name, HeaderValue::from_static("v"));
        }
        assert!(map_weight(&map, FIELDS_LIMIT_BYTES) > empty + 500 * MAP_SLOT_BYTES);
    }
}
