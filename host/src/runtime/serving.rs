//! The guest serving new requests: one value, swapped whole by a reload, while requests already
//! running keep the guest they started with.

use std::sync::{Arc, PoisonError, RwLock};

use crate::runtime::guest::Guest;

/// A loaded guest and the version its health probe reported.
pub struct ServingGuest {
    /// The pre-instantiated component; cheap to clone.
    pub guest: Guest,
    /// `version` from the guest's `/api/health`, for logs.
    pub version: String,
}

/// The guest serving new requests.
pub struct Serving(RwLock<Arc<ServingGuest>>);

impl Serving {
    /// Serves with `guest` until a swap.
    pub fn new(guest: ServingGuest) -> Serving {
        Serving(RwLock::new(Arc::new(guest)))
    }

    /// The guest serving new requests now.
    pub fn current(&self) -> Arc<ServingGuest> {
        // Only an `Arc` is cloned under the lock: the per-request cost is one atomic increment.
        Arc::clone(&self.0.read().unwrap_or_else(PoisonError::into_inner))
    }

    /// Serves new requests with `guest` from now on; returns the guest it replaces.
    pub fn swap(&self, guest: ServingGuest) -> Arc<ServingGuest> {
        let mut serving = self.0.write().unwrap_or_else(PoisonError::into_inner);
        std::mem::replace(&mut serving, Arc::new(guest))
    }
}
