//! Events of the webhook's controllers: the shared publisher of `nodewarden-runtime`, reporting
//! as `nodewarden-controllers` with the pod's name as instance.

use kube::Client;
use kube::runtime::events::Recorder;
pub(crate) use nodewarden_runtime::events::publish;

use crate::controllers::FIELD_MANAGER;

/// The recorder of nodewarden's controllers (`reportingController: nodewarden-controllers`).
pub(crate) fn recorder(client: &Client) -> Recorder {
    nodewarden_runtime::events::recorder(
        client,
        FIELD_MANAGER,
        std::env::var("HOSTNAME").ok().filter(|h| !h.is_empty()),
    )
}
