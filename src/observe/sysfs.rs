//! sysfs observer. Placeholder until it lands.
