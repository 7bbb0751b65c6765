// Command enqueue is the taskrl enqueue binary described in DESIGN.md's command-line
// contract. It is being built; for now it says so and exits with status 2.
package main

import (
	"fmt"
	"os"
)

func main() {
	fmt.Fprintln(os.Stderr, "taskrl enqueue: not implemented yet")
	os.Exit(2)
}
