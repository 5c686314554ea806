//! rpull-registry
