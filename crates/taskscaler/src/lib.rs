//! Taskscaler: decides how many instances exist and which job gets which slot.
//!
//! Reserve → acquire → release, as in GitLab's taskscaler. The scale decision
//! ([`decision::decide`]) is a pure function; [`Taskscaler`] runs it in a loop over an
//! [`slipway_fleeting::InstanceGroup`].
//!
//! - [`config`]: the `[runners.autoscaler]` keys this version honours; [`policy`]: idle
//!   capacity targets by cron period.
//! - [`decision`]: the pure scale decision; [`forecast`]: Slipway's demand forecast.
//! - [`scaler`]: the running [`Taskscaler`]: reservations, acquisitions, the scaling loop.
//! - [`placement`]: shapes of different sizes and where each job goes; [`packing`]: first-fit
//!   decreasing of multi-slot jobs; [`resources`]: what a job asks and an instance offers.
//! - [`fallback`]: spot capacity with a fallback shape when `Increase` is refused.
//! - [`hooks`]: the runner's instance checks, injected; [`metrics`]: Prometheus families.
//! - [`store`]: persistent state (instances, use counts, acquisitions, undelivered reports).

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
