//! The wasm edge: `wasi:http` in, [`api::handle`] in the middle, `wasi:http` out.
//!
//! Nothing here decides anything. It copies the request into an [`api::Request`], implements the
//! ports on the host's `users` interface and WASI's clock, and copies the response back.

use alloc::format;
use alloc::string::{String, ToString};
use alloc::vec::Vec;
use core::alloc::{GlobalAlloc, Layout};
use core::sync::atomic::{AtomicBool, Ordering};

use wasi::http::types::{
    Fields, IncomingRequest, Method, OutgoingBody, OutgoingResponse, ResponseOutparam,
};
use wasi::io::streams::{OutputStream, StreamError};

use crate::api;
use crate::ports::{self, Attribute, Clock, CreateError, Level, Unavailable, User, UserStore};
use crate::response::{BodyWriter, ClientGone, Responder};

wit_bindgen::generate!({
    path: "../wit",
    world: "tutorial:service/service",
    // Import parameters borrow the guest's own strings: no key or text is copied into an owned
    // record only to be lowered. What the host returns (`users::User`) stays owned.
    ownership: Borrowing { duplicate_if_necessary: false },
    // Reuse the `wasi` crate's types for every WASI interface instead of generating copies.
    with: {
        "wasi:io/error@0.2.12": wasi::io::error,
        "wasi:io/poll@0.2.12": wasi::io::poll,
        "wasi:io/streams@0.2.12": wasi::io::streams,
        "wasi:clocks/monotonic-clock@0.2.12": wasi::clocks::monotonic_clock,
        "wasi:clocks/wall-clock@0.2.12": wasi::clocks::wall_clock,
        "wasi:random/random@0.2.12": wasi::random::random,
        "wasi:cli/stdin@0.2.12": wasi::cli::stdin,
        "wasi:cli/stdout@0.2.12": wasi::cli::stdout,
        "wasi:cli/stderr@0.2.12": wasi::cli::stderr,
        "wasi:http/types@0.2.12": wasi::http::types,
        "wasi:http/outgoing-handler@0.2.12": wasi::http::outgoing_handler,
    },
});

use tutorial::service::{telemetry, users};

/// The most bytes one `blocking-write-and-flush` takes (`wasi:io/streams`).
const WRITE_CHUNK: usize = 4096;
/// The most bytes asked of the request body per host call; the host bounds the whole body.
const READ_CHUNK: u64 = 64 * 1024;

struct Component;

export!(Component);

/// The instance's allocator: dlmalloc, Rust's own wasm allocator (`std`'s, wasi-libc's malloc,
/// is not linked in a `no_std` guest), trapping where it would fail: the memory the host
/// refuses (the instance's limit, the host-wide budget) ends the instance at once, as `std`'s
/// handler did, and the host answers 503 or 500 and says why. Without the trap `alloc` would
/// make a panic of it, and an ERROR line.
#[global_allocator]
static ALLOCATOR: TrapWhenExhausted<dlmalloc::GlobalDlmalloc> =
    TrapWhenExhausted(dlmalloc::GlobalDlmalloc);

/// A global allocator that traps instead of returning null.
struct TrapWhenExhausted<A>(A);

// SAFETY: every call goes to the inner allocator as it came; a null result is never returned,
// the instance traps instead.
unsafe impl<A: GlobalAlloc> GlobalAlloc for TrapWhenExhausted<A> {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        granted(unsafe { self.0.alloc(layout) })
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        granted(unsafe { self.0.alloc_zeroed(layout) })
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { self.0.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        granted(unsafe { self.0.realloc(ptr, layout, new_size) })
    }
}

fn granted(ptr: *mut u8) -> *mut u8 {
    if ptr.is_null() {
        core::arch::wasm32::unreachable()
    }
    ptr
}

/// The canonical ABI's allocator, through which the host places the request's strings and lists
/// in the guest's memory; wasi-libc provides it where `std` is linked. A size or alignment no
/// `Layout` can hold traps.
#[unsafe(no_mangle)]
unsafe extern "C" fn cabi_realloc(
    old_ptr: *mut u8,
    old_len: usize,
    align: usize,
    new_len: usize,
) -> *mut u8 {
    let layout = |size| {
        Layout::from_size_align(size, align).unwrap_or_else(|_| core::arch::wasm32::unreachable())
    };
    // SAFETY: the canonical ABI gives back only a pointer this function returned, with the size
    // and alignment it was returned for; a zero size is never allocated.
    unsafe {
        match (old_len, new_len) {
            (0, 0) => align as *mut u8,
            (0, _) => alloc::alloc::alloc(layout(new_len)),
            (_, 0) => {
                alloc::alloc::dealloc(old_ptr, layout(old_len));
                align as *mut u8
            }
            (_, _) => {
                let new = layout(new_len);
                alloc::alloc::realloc(old_ptr, layout(old_len), new.size())
            }
        }
    }
}

// `memcmp` (comparing slices and strings) from wasi-libc, which the target ships and `std` would
// have linked: the archive gives only the objects asked for, which import nothing.
#[link(name = "c")]
unsafe extern "C" {}

/// A panic is a bug in the guest. The instance has no stderr worth writing to (the host gives it
/// none), so the message goes to the host's log as an ERROR line of the request, and the
/// instance traps: the host answers 500, or cuts the response short if its head has gone.
#[panic_handler]
fn panic(info: &core::panic::PanicInfo<'_>) -> ! {
    // A panic while reporting one (the message could not be allocated) traps at once.
    static REPORTING: AtomicBool = AtomicBool::new(false);
    if !REPORTING.swap(true, Ordering::Relaxed) {
        let message = match info.location() {
            Some(at) => format!("guest panicked at {at}: {}", info.message()),
            None => format!("guest panicked: {}", info.message()),
        };
        telemetry::log(telemetry::Level::Error, &message, &[]);
    }
    core::arch::wasm32::unreachable()
}

impl exports::wasi::http::incoming_handler::Guest for Component {
    fn handle(request: IncomingRequest, response_out: ResponseOutparam) {
        let method = method_name(&request.method());
        let target = request.path_with_query().unwrap_or_default();
        // Each host call costs the request time: the headers are asked for only when the
        // logic will read them.
        let content_type = if api::reads_content_type(&method) {
            request
                .headers()
                .get("content-type")
                .into_iter()
                .next()
                .map(|value| String::from_utf8_lossy(&value).into_owned())
        } else {
            None
        };
        let responder = WasiResponder(response_out);
        // Only a body the logic parses is read: five host calls a request fewer for the rest.
        let body = if api::reads_body(&method, &target) {
            match read_body(request) {
                Some(body) => body,
                None => return api::unreadable_body(&target, &HostTelemetry, responder),
            }
        } else {
            Vec::new()
        };
        let request = api::Request {
            method: &method,
            target: &target,
            content_type: content_type.as_deref(),
            body: &body,
        };
        let ports = api::Ports {
            store: &HostUsers,
            clock: &WasiClock,
            telemetry: &HostTelemetry,
        };
        api::handle(&request, &ports, responder);
    }
}

fn method_name(method: &Method) -> String {
    match method {
        Method::Get => "GET",
        Method::Head => "HEAD",
        Method::Post => "POST",
        Method::Put => "PUT",
        Method::Delete => "DELETE",
        Method::Connect => "CONNECT",
        Method::Options => "OPTIONS",
        Method::Trace => "TRACE",
        Method::Patch => "PATCH",
        Method::Other(other) => other,
    }
    .to_string()
}

/// The whole request body, or `None` when the stream fails.
fn read_body(request: IncomingRequest) -> Option<Vec<u8>> {
    let body = request.consume().ok()?;
    let mut bytes = Vec::new();
    {
        // The stream is a child of the body: it must be dropped before the body is.
        let stream = body.stream().ok()?;
        loop {
            match stream.blocking_read(READ_CHUNK) {
                Ok(chunk) => bytes.extend_from_slice(&chunk),
                Err(StreamError::Closed) => break,
                Err(StreamError::LastOperationFailed(_)) => return None,
            }
        }
    }
    // Dropped rather than finished: the service reads no trailers, and `finish` would cost two
    // host calls (itself and its trailers' future) where the drop costs one.
    drop(body);
    Some(bytes)
}

/// The `wasi:http` response of this request.
struct WasiResponder(ResponseOutparam);

impl Responder for WasiResponder {
    type Body = WasiBody;

    fn send_head(
        self,
        status: u16,
        headers: Vec<(&'static str, String)>,
        content_length: Option<usize>,
    ) -> WasiBody {
        let mut fields: Vec<(String, Vec<u8>)> = headers
            .into_iter()
            .map(|(name, value)| (name.to_string(), value.into_bytes()))
            .collect();
        if let Some(length) = content_length {
            fields.push(("content-length".into(), length.to_string().into_bytes()));
        }
        let headers = Fields::from_list(&fields).expect("our header names and values are valid");
        let outgoing = OutgoingResponse::new(headers);
        // A new response is a 200 already: one host call fewer for most answers.
        if status != 200 {
            outgoing
                .set_status_code(status)
                .expect("our status codes are valid");
        }
        let body = outgoing
            .body()
            .expect("a new response's body is taken once");
        ResponseOutparam::set(self.0, Ok(outgoing));
        WasiBody {
            stream: body.write().ok(),
            body,
        }
    }
}

/// A response body being written. Fields drop in order: the stream is a child of the body and
/// must go first. Dropped unfinished, the body tells the host the response was cut short.
struct WasiBody {
    stream: Option<OutputStream>,
    body: OutgoingBody,
}

impl BodyWriter for WasiBody {
    fn write(&mut self, bytes: &[u8]) -> Result<(), ClientGone> {
        // Once the head is sent, a failed write only means the client has gone.
        let stream = self.stream.as_ref().ok_or(ClientGone)?;
        // One host call per chunk, written and flushed; `std::io::Write` would take three
        // (check, write, flush).
        let mut chunks = bytes.chunks(WRITE_CHUNK).peekable();
        while let Some(chunk) = chunks.next() {
            match stream.blocking_write_and_flush(chunk) {
                Ok(()) => {}
                // Once the body's last byte is in, the host may close the stream before the
                // flush returns. The next write, if any, finds the client gone; `finish` knows
                // from the bytes counted whether the body is whole.
                Err(StreamError::Closed) if chunks.peek().is_none() => {
                    self.stream = None;
                    return Ok(());
                }
                Err(_) => return Err(ClientGone),
            }
        }
        Ok(())
    }

    fn finish(self) {
        // Every write was flushed: nothing is left to flush before the body ends.
        let WasiBody { stream, body } = self;
        drop(stream);
        let _ = OutgoingBody::finish(body, None);
    }
}

/// The host's user store, reached through the `users` WIT interface.
struct HostUsers;

impl From<users::User> for User {
    fn from(user: users::User) -> User {
        User {
            id: user.id,
            name: user.name,
            email: user.email,
        }
    }
}

impl UserStore for HostUsers {
    fn list_page(&self, after: Option<&str>, limit: u32) -> Result<Vec<User>, Unavailable> {
        let page =
            users::list(after, limit).map_err(|users::StoreError::Unavailable| Unavailable)?;
        Ok(page.into_iter().map(User::from).collect())
    }

    fn get(&self, id: &str) -> Result<Option<User>, Unavailable> {
        let found = users::get(id).map_err(|users::StoreError::Unavailable| Unavailable)?;
        Ok(found.map(User::from))
    }

    fn create(&self, name: &str, email: &str) -> Result<User, CreateError> {
        users::create(name, email)
            .map(User::from)
            .map_err(|error| match error {
                users::CreateError::DuplicateEmail => CreateError::DuplicateEmail,
                users::CreateError::StoreFull => CreateError::StoreFull,
                users::CreateError::Unavailable => CreateError::Unavailable,
            })
    }
}

/// WASI's monotonic clock.
struct WasiClock;

impl Clock for WasiClock {
    fn now_nanos(&self) -> u64 {
        wasi::clocks::monotonic_clock::now()
    }
}

/// The host's telemetry, reached through the `telemetry` WIT interface.
struct HostTelemetry;

impl ports::Telemetry for HostTelemetry {
    type Span = telemetry::Span;

    fn span(&self, name: &'static str, attributes: &[Attribute]) -> telemetry::Span {
        telemetry::Span::new(name, &to_wit(attributes))
    }

    fn log(&self, level: Level, message: &str, attributes: &[Attribute]) {
        let level = match level {
            Level::Debug => telemetry::Level::Debug,
            Level::Info => telemetry::Level::Info,
            Level::Warn => telemetry::Level::Warn,
            Level::Error => telemetry::Level::Error,
        };
        telemetry::log(level, message, &to_wit(attributes));
    }

    fn set_route(&self, template: &'static str) {
        telemetry::set_route(template);
    }
}

impl ports::Span for telemetry::Span {
    fn set_attribute(&self, attribute: Attribute) {
        telemetry::Span::set_attribute(self, attribute_to_wit(&attribute));
    }
}

fn to_wit(attributes: &[Attribute]) -> Vec<telemetry::Attribute<'_>> {
    attributes.iter().map(attribute_to_wit).collect()
}

fn attribute_to_wit((key, value): &Attribute) -> telemetry::Attribute<'_> {
    let value = match value {
        ports::Value::Text(text) => telemetry::Value::Text(text),
        ports::Value::Integer(number) => telemetry::Value::Integer(*number),
    };
    telemetry::Attribute { key, value }
}
