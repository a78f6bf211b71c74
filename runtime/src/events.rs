//! Events on the objects nodewarden acts on (`kubectl describe` tells the story), published
//! through kube-runtime's [`Recorder`] as `events.k8s.io/v1` Events. A failed publish is logged
//! and never stops the caller.

use k8s_openapi::api::core::v1::ObjectReference;
use kube::Client;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};

/// The API server refuses an Event whose note is longer than this (bytes).
pub const NOTE_LIMIT: usize = 1024;

/// A recorder reporting as `controller` (`reportingController`), instance `instance`
/// (`reportingInstance`: a pod or node name).
pub fn recorder(client: &Client, controller: &str, instance: Option<String>) -> Recorder {
    Recorder::new(
        client.clone(),
        Reporter {
            controller: controller.to_string(),
            instance,
        },
    )
}

/// Publishes one Event about `regarding`; `warning` makes it a `Warning`, else `Normal`. A note
/// over [`NOTE_LIMIT`] is cut at a character boundary.
pub async fn publish(
    recorder: &Recorder,
    regarding: &ObjectReference,
    warning: bool,
    action: &str,
    reason: &str,
    note: String,
) {
    let event = Event {
        type_: if warning {
            EventType::Warning
        } else {
            EventType::Normal
        },
        reason: reason.to_string(),
        note: Some(clip(note)),
        action: action.to_string(),
        secondary: None,
    };
    if let Err(err) = recorder.publish(&event, regarding).await {
        tracing::warn!(error = %err, object = ?regarding.name, reason, "publishing an Event failed");
    }
}

fn clip(mut note: String) -> String {
    if note.len() > NOTE_LIMIT {
        let mut end = NOTE_LIMIT;
        while !note.is_char_boundary(end) {
            end -= 1;
        }
        note.truncate(end);
    }
    note
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn notes_are_cut_at_the_limit_on_a_character_boundary() {
        assert_eq!(clip("short".to_string()), "short");
        let long = "é".repeat(NOTE_LIMIT);
        let cut = clip(long);
        assert!(
            cut.len() <= NOTE_LIMIT && cut.len() >= NOTE_LIMIT - 1,
            "{}",
            cut.len()
        );
        assert!(cut.chars().all(|c| c == 'é'));
    }
}
