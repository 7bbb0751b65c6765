//go:build !race

package main

// raceEnabled reports that the tests run with the race detector, so the
// worker binary they build uses it too (and reuses the cached packages).
const raceEnabled = false
