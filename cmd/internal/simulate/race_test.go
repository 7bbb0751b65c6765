//go:build race

package simulate

// raceEnabled makes TestAdaptiveGrid run a fifth of its sample, and
// TestAdaptiveConcurrency two of its cases, under the race detector, which
// slows the simulation four- to tenfold.
const raceEnabled = true
