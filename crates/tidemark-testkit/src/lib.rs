//! The test harness. Everything it starts binds to 127.0.0.1 on a free port and is stopped
//! when its handle drops, even when the test fails (a panic unwinds through the drop).

pub mod azure_double;
pub mod emulators;
pub mod gcp_double;
pub mod process;
pub mod throttle;
pub mod tls;

pub use azure_double::AzureArmDouble;
pub use emulators::{Azurite, FakeGcs, Moto, Postgres, PubSub, unique_name};
pub use gcp_double::GcpDouble;
pub use process::{LogsOnFailure, TidemarkProcess, eventually, fails, free_port, ok, run_shell};
pub use throttle::throttling_proxy;
