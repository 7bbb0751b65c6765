// Package e2e holds the end-to-end test of the product as a user runs it:
// the real worker and enqueue binaries, built from this module, against a
// real redis-server and a strict stand-in for a third-party API
// (internal/examples/fakeapi). It has no code of its own.
//
// Test support: only tests, imported by nothing.
package e2e
