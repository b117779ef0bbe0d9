//! Taskscaler: decides how many instances exist and which job gets which slot.
//!
//! Reserve → acquire → release, as in GitLab's taskscaler. The scale decision
//! ([`decision::decide`]) is a pure function; [`Taskscaler`] runs it in a loop over an
//! [`slipway_fleeting::InstanceGroup`].

pub mod config;
pub mod decision;
pub mod fallback;
pub mod forecast;
pub mod hooks;
pub mod metrics;
pub mod packing;
pub mod placement;
pub mod policy;
pub mod resources;
pub mod scaler;
pub mod store;

pub use config::{Config, Forecast, ScaleThrottle};
pub use fallback::{Fallback, Refusals};
pub use hooks::InstanceHooks;
pub use metrics::Metrics;
pub use placement::{Placement, Shape};
pub use policy::Policy;
pub use resources::Resources;
pub use scaler::{Acquisition, Error, InstanceStatus, Options, Stats, Taskscaler};
pub use store::{
    AcquisitionRecord, AsyncStateStore, InstanceRecord, RestorePlan, Snapshot, StateStore,
    StoreError, StoreIdentity, plan_restore,
};
