//! Test doubles and helpers shared by the endpoints' tests: an in-memory store, a stepping clock,
//! telemetry that records what it is told, a responder that collects the answer.

use std::cell::{Cell, RefCell};

use serde_json::{Value, json};

use super::*;
use crate::ports::{
    Attribute, Clock, CreateError, Level, Span, Telemetry, Unavailable, User, UserStore,
};
use crate::response::{BodyWriter, Responder, Response};

/// An in-memory store with the host's rules: creation order, case-insensitive e-mails, a cap.
/// It can be told to fail, from its `n`-th call on.
pub(crate) struct FakeStore {
    pub(crate) users: RefCell<Vec<User>>,
    pub(crate) capacity: usize,
    pub(crate) calls: Cell<usize>,
    pub(crate) fails_from_call: Cell<usize>,
}

impl FakeStore {
    pub(crate) fn new() -> FakeStore {
        FakeStore {
            users: RefCell::default(),
            capacity: usize::MAX,
            calls: Cell::new(0),
            fails_from_call: Cell::new(usize::MAX),
        }
    }

    /// Every user, straight from the store.
    pub(crate) fn all(&self) -> Vec<User> {
        self.users.borrow().clone()
    }

    /// From now on, the `n`-th call (0: the next one) and every later one is `Unavailable`.
    pub(crate) fn fail_from_call(&self, n: usize) {
        self.fails_from_call.set(self.calls.get() + n);
    }

    pub(crate) fn call(&self) -> Result<(), Unavailable> {
        let call = self.calls.get();
        self.calls.set(call + 1);
        if call >= self.fails_from_call.get() {
            Err(Unavailable)
        } else {
            Ok(())
        }
    }
}

impl UserStore for FakeStore {
    fn list_page(&self, after: Option<&str>, limit: u32) -> Result<Vec<User>, Unavailable> {
        self.call()?;
        let users = self.users.borrow();
        let start = match after {
            None => 0,
            Some(id) => match users.iter().position(|user| user.id == id) {
                Some(position) => position + 1,
                None => users.len(),
            },
        };
        Ok(users[start..]
            .iter()
            .take(limit as usize)
            .cloned()
            .collect())
    }
    fn get(&self, id: &str) -> Result<Option<User>, Unavailable> {
        self.call()?;
        Ok(self
            .users
            .borrow()
            .iter()
            .find(|user| user.id == id)
            .cloned())
    }
    fn create(&self, name: &str, email: &str) -> Result<User, CreateError> {
        self.call()
            .map_err(|Unavailable| CreateError::Unavailable)?;
        let mut users = self.users.borrow_mut();
        if users
            .iter()
            .any(|user| user.email.eq_ignore_ascii_case(email))
        {
            return Err(CreateError::DuplicateEmail);
        }
        if users.len() >= self.capacity {
            return Err(CreateError::StoreFull);
        }
        let user = User {
            id: format!("00000000-0000-4000-8000-{:012x}", users.len()),
            name: name.into(),
            email: email.into(),
        };
        users.push(user.clone());
        Ok(user)
    }
}

/// A response collected in memory, and whether its body was finished (not aborted).
#[derive(Default)]
pub(crate) struct Collected {
    pub(crate) head: Option<Head>,
    pub(crate) body: Vec<u8>,
    pub(crate) finished: bool,
}

/// A response head as sent.
pub(crate) struct Head {
    pub(crate) status: u16,
    pub(crate) headers: Vec<(&'static str, String)>,
    pub(crate) content_length: Option<usize>,
}

pub(crate) struct Collector<'a>(pub(crate) &'a RefCell<Collected>);

impl<'a> Responder for Collector<'a> {
    type Body = Collector<'a>;
    fn send_head(
        self,
        status: u16,
        headers: Vec<(&'static str, String)>,
        content_length: Option<usize>,
    ) -> Collector<'a> {
        self.0.borrow_mut().head = Some(Head {
            status,
            headers,
            content_length,
        });
        self
    }
}

impl BodyWriter for Collector<'_> {
    fn write(&mut self, bytes: &[u8]) -> Result<(), crate::response::ClientGone> {
        self.0.borrow_mut().body.extend_from_slice(bytes);
        Ok(())
    }
    fn finish(self) {
        self.0.borrow_mut().finished = true;
    }
}

/// A clock that advances by a fixed step each time it is read.
pub(crate) struct SteppingClock {
    pub(crate) now: Cell<u64>,
    pub(crate) step: u64,
}

impl Clock for SteppingClock {
    fn now_nanos(&self) -> u64 {
        let now = self.now.get();
        self.now.set(now + self.step);
        now
    }
}

pub(crate) fn clock() -> SteppingClock {
    SteppingClock {
        now: Cell::new(0),
        step: 7_400_000,
    }
}

/// Records every span and log event the logic reports, and the routes it names.
#[derive(Default)]
pub(crate) struct RecordingTelemetry {
    pub(crate) events: RefCell<Vec<String>>,
    pub(crate) routes: RefCell<Vec<&'static str>>,
}

pub(crate) struct RecordedSpan<'a> {
    pub(crate) name: &'static str,
    pub(crate) events: &'a RefCell<Vec<String>>,
}

impl<'a> Telemetry for &'a RecordingTelemetry {
    type Span = RecordedSpan<'a>;
    fn span(&self, name: &'static str, attributes: &[Attribute]) -> RecordedSpan<'a> {
        self.events
            .borrow_mut()
            .push(format!("span {name} {attributes:?}"));
        RecordedSpan {
            name,
            events: &self.events,
        }
    }
    fn log(&self, level: Level, message: &str, attributes: &[Attribute]) {
        self.events
            .borrow_mut()
            .push(format!("{level:?} {message} {attributes:?}"));
    }
    fn set_route(&self, template: &'static str) {
        self.routes.borrow_mut().push(template);
    }
}

impl Span for RecordedSpan<'_> {
    fn set_attribute(&self, attribute: Attribute) {
        self.events
            .borrow_mut()
            .push(format!("set {} {attribute:?}", self.name));
    }
}

impl Drop for RecordedSpan<'_> {
    fn drop(&mut self) {
        self.events.borrow_mut().push(format!("end {}", self.name));
    }
}

pub(crate) fn run(request: &Request<'_>, store: &FakeStore) -> Response {
    run_recorded(request, store).0
}

/// Runs a request and returns the response with what it reported, one line per event.
/// Every response here is complete: its body finished, its length declared if it was known.
pub(crate) fn run_recorded(request: &Request<'_>, store: &FakeStore) -> (Response, Vec<String>) {
    let (collected, events) = run_collected(request, store);
    assert!(collected.finished, "the body was aborted");
    let Head {
        status,
        headers,
        content_length,
    } = collected.head.expect("a head was sent");
    if let Some(length) = content_length {
        assert_eq!(
            length,
            collected.body.len(),
            "declared and sent lengths differ"
        );
    }
    let response = Response {
        status,
        headers,
        body: collected.body,
    };
    (response, events)
}

/// Runs a request and returns what reached the responder, finished or not.
pub(crate) fn run_collected(request: &Request<'_>, store: &FakeStore) -> (Collected, Vec<String>) {
    let telemetry = RecordingTelemetry::default();
    let collected = RefCell::new(Collected::default());
    handle(
        request,
        &Ports {
            store,
            clock: &clock(),
            telemetry: &&telemetry,
        },
        Collector(&collected),
    );
    (collected.into_inner(), telemetry.events.take())
}

/// The routes a request names to the host.
pub(crate) fn routes_named(request: &Request<'_>) -> Vec<&'static str> {
    let telemetry = RecordingTelemetry::default();
    handle(
        request,
        &Ports {
            store: &FakeStore::new(),
            clock: &clock(),
            telemetry: &&telemetry,
        },
        Collector(&RefCell::new(Collected::default())),
    );
    telemetry.routes.take()
}

pub(crate) fn post(target: &str, body: &str) -> Request<'static> {
    let (target, body) = (target.to_string().leak(), body.to_string().leak());
    Request {
        method: "POST",
        target,
        content_type: Some("application/json"),
        body: body.as_bytes(),
    }
}

pub(crate) fn get(target: &str) -> Request<'static> {
    Request {
        method: "GET",
        target: target.to_string().leak(),
        content_type: None,
        body: b"",
    }
}

pub(crate) fn send(store: &FakeStore, method: &str, target: &str, body: Option<&str>) -> Response {
    let request = Request {
        method,
        target,
        content_type: body.map(|_| "application/json"),
        body: body.unwrap_or_default().as_bytes(),
    };
    run(&request, store)
}

pub(crate) fn body(response: &Response) -> Value {
    serde_json::from_slice(&response.body).expect("every response body is JSON")
}

pub(crate) fn assert_error(response: &Response, status: u16, message: &str) {
    assert_eq!(response.status, status);
    assert_eq!(response.header("content-type"), Some("application/json"));
    assert_eq!(body(response), json!({ "error": message }));
}

/// Stores `count` users straight into `store`, skipping the API.
pub(crate) fn fill(store: &FakeStore, count: usize) {
    for i in 0..count {
        store
            .create(&format!("User {i}"), &format!("u{i}@x.io"))
            .unwrap();
    }
}
