//! Bench guest: a `wasi:http` component written without the standard library, the shape of
//! guests built by other toolchains or by hand. It answers every request, whatever its method
//! and path, with 200 and the health JSON of version 0.0.1, written with one
//! `blocking_write_and_flush` after `ResponseOutparam::set`, then `OutgoingBody::finish`.
//!
//! What makes it worth measuring: its allocator (dlmalloc over `memory.grow`) grows linear
//! memory past the module's initial size in every fresh instance, which a Rust `std` guest
//! (wasi-libc's malloc, starting inside the initial memory) never does. `make bench` serves it
//! with the host and with `wasmtime serve`; bench/PROFILE.md explains what growing costs.

#![cfg_attr(target_arch = "wasm32", no_std)]

#[cfg(target_arch = "wasm32")]
mod component {
    extern crate alloc;

    use alloc::string::ToString;

    use wasi::http::types::{
        Fields, IncomingRequest, OutgoingBody, OutgoingResponse, ResponseOutparam,
    };

    #[global_allocator]
    static ALLOCATOR: dlmalloc::GlobalDlmalloc = dlmalloc::GlobalDlmalloc;

    #[panic_handler]
    fn panic(_: &core::panic::PanicInfo) -> ! {
        core::arch::wasm32::unreachable()
    }

    /// The canonical ABI's allocator export, which `std` would provide: the host calls it to
    /// place arguments (the request's strings and lists) in the guest's memory.
    #[unsafe(no_mangle)]
    unsafe extern "C" fn cabi_realloc(
        old_ptr: *mut u8,
        old_len: usize,
        align: usize,
        new_len: usize,
    ) -> *mut u8 {
        use alloc::alloc::{Layout, alloc, handle_alloc_error, realloc};
        if new_len == 0 {
            return align as *mut u8;
        }
        let Ok(layout) = Layout::from_size_align(new_len, align) else {
            core::arch::wasm32::unreachable()
        };
        // SAFETY: the canonical ABI passes back a pointer this function returned, with the
        // length and alignment it was returned for, or a zero length for a fresh allocation.
        let ptr = unsafe {
            if old_len == 0 {
                alloc(layout)
            } else {
                let old = Layout::from_size_align_unchecked(old_len, align);
                realloc(old_ptr, old, new_len)
            }
        };
        if ptr.is_null() {
            handle_alloc_error(layout);
        }
        ptr
    }

    const BODY: &[u8] = br#"{"status":"healthy","version":"0.0.1"}"#;

    struct HelloNoStd;

    impl wasi::exports::http::incoming_handler::Guest for HelloNoStd {
        fn handle(_request: IncomingRequest, response_out: ResponseOutparam) {
            let headers = Fields::from_list(&[
                ("content-type".to_string(), b"application/json".to_vec()),
                (
                    "content-length".to_string(),
                    BODY.len().to_string().into_bytes(),
                ),
            ])
            .expect("valid headers");
            let response = OutgoingResponse::new(headers);
            let body = response.body().expect("body taken once");
            ResponseOutparam::set(response_out, Ok(response));
            if let Ok(stream) = body.write() {
                let _ = stream.blocking_write_and_flush(BODY);
            }
            let _ = OutgoingBody::finish(body, None);
        }
    }

    wasi::http::proxy::export!(HelloNoStd);
}
