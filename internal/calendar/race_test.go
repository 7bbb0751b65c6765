//go:build race

package calendar

// raceEnabled makes the slowest exhaustive tests sample more sparsely under
// the race detector, which slows this CPU-bound code about tenfold.
const raceEnabled = true
