//! Events on the objects the controllers act on (`kubectl describe` tells the story), published
//! through kube-runtime's [`Recorder`] as `events.k8s.io/v1` Events. A failed publish is logged
//! and never stops a controller.

use k8s_openapi::api::core::v1::ObjectReference;
use kube::Client;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};

use crate::controllers::FIELD_MANAGER;

/// The recorder of nodewarden's controllers (`reportingController: nodewarden-controllers`).
pub(crate) fn recorder(client: &Client) -> Recorder {
    Recorder::new(
        client.clone(),
        Reporter {
            controller: FIELD_MANAGER.to_string(),
            instance: std::env::var("HOSTNAME").ok().filter(|h| !h.is_empty()),
        },
    )
}

/// Publishes one Event about `regarding`; `warning` makes it a `Warning`, else `Normal`.
pub(crate) async fn publish(
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
        note: Some(note),
        action: action.to_string(),
        secondary: None,
    };
    if let Err(err) = recorder.publish(&event, regarding).await {
        tracing::warn!(error = %err, object = ?regarding.name, reason, "publishing an Event failed");
    }
}
