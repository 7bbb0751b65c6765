package redisurl

import (
	"strings"
	"testing"
)

func TestParse(t *testing.T) {
	for in, addr := range map[string]string{
		"redis://:pw@db.example:6380/2": "db.example:6380",
		"rediss://db.example":           "db.example:6379",
		"10.0.0.1:7000":                 "10.0.0.1:7000",
		"localhost":                     "localhost:6379",
		":6379":                         "localhost:6379",
		"[::1]:6379":                    "[::1]:6379",
	} {
		o, err := Parse(in)
		if err != nil || o.Addr != addr {
			t.Errorf("Parse(%q) = %v, %v; want %s", in, o, err, addr)
		}
	}
	for in, want := range map[string]string{
		"http://localhost:6379":        "not a valid Redis URL",
		"redis://:hunter2@host:port/0": "not a valid Redis URL",
		"redis://host/db9x":            "not a valid Redis URL",
		"host:0":                       "port must be a number from 1 to 65535",
		"user@host":                    "is neither a Redis URL nor host:port",
		"redis://u:s3cret@host:port":   "not a valid Redis URL",
	} {
		_, err := Parse(in)
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Parse(%q): %v; want %q", in, err, want)
		}
		if err != nil && (strings.Contains(err.Error(), "hunter2") || strings.Contains(err.Error(), "s3cret")) {
			t.Errorf("Parse(%q): the error shows the password: %v", in, err)
		}
	}
}
