//! Every client message of the realtime protocol: `ClientMessage::parse` on the text,
//! then `StartRequest::parse` (server defaults) or `Interaction::parse` (server limits),
//! and a checked camera update applied for one chunk as a session would.
#![no_main]

use headroom_model::camera::InteractionHandler;
use headroom_server::protocol::{ClientMessage, Interaction, StartRequest};
use headroom_server::{Defaults, Limits};
use libfuzzer_sys::fuzz_target;
// The 256 MiB heap bound (src/lib.rs) holds only where the library is linked.
use headroom_fuzz as _;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    match ClientMessage::parse(text) {
        Ok(ClientMessage::Start(map)) => {
            if let Ok(start) = StartRequest::parse(&map, &Defaults::default()) {
                let _ = start.config("small", headroom_model::DecoderKind::Full);
            }
        }
        Ok(ClientMessage::Interaction(map)) => {
            if let Ok(event) = Interaction::parse(&map, &Limits::default(), || "e".into()) {
                if let Some(camera) = event.camera {
                    let mut handler = InteractionHandler::default();
                    if handler.queue(camera).is_ok() {
                        let _ = handler.step_chunk(3);
                    }
                }
            }
        }
        _ => {}
    }
});
