package main

import (
	"regexp"
	"strings"
	"testing"
)

// Every flag of every command and subcommand that -h lists names its
// environment variable or says it has none: -h is the one place a user
// learns how to set it.
func TestEveryFlagSaysItsEnvironmentVariable(t *testing.T) {
	// Subcommands as the commands' own help names them:
	// "deepseed job <submit|list|…>" and "deepseed bench ingest [flags]".
	group := regexp.MustCompile(`deepseed (\w+) <([a-z]+(?:\|[a-z]+)+)>`)
	single := regexp.MustCompile(`(?m)^(?:Usage:)?\s+deepseed (\w+) ([a-z]+) \[flags\]`)
	var todo [][]string
	for _, c := range commands {
		code, out, stderr := runBinary(t, nil, c.name, "-h")
		if code != 0 {
			t.Fatalf("deepseed %s -h: exit %d: %s", c.name, code, stderr)
		}
		todo = append(todo, []string{c.name})
		seen := map[string]bool{}
		for _, m := range group.FindAllStringSubmatch(out, -1) {
			for _, sub := range strings.Split(m[2], "|") {
				seen[sub] = true
			}
		}
		for _, m := range single.FindAllStringSubmatch(out, -1) {
			seen[m[2]] = true
		}
		for sub := range seen {
			todo = append(todo, []string{c.name, sub})
		}
	}
	flags := 0
	for _, args := range todo {
		code, out, stderr := runBinary(t, nil, append(args, "-h")...)
		if code != 0 {
			t.Errorf("deepseed %s -h: exit %d: %s", strings.Join(args, " "), code, stderr)
			continue
		}
		for _, block := range flagBlocks(out) {
			flags++
			if !strings.Contains(block, "(env DEEPSEED_") && !strings.Contains(block, "(no environment variable") {
				t.Errorf("deepseed %s -h: a flag names no environment variable and does not say it has none:\n%s",
					strings.Join(args, " "), block)
			}
		}
	}
	if len(todo) < 15 || flags < 100 {
		t.Fatalf("walked %d commands and %d flags; the help's shape changed under this test", len(todo), flags)
	}
}

// flagBlocks splits a help text into one block per "  --name" line, with
// the indented lines under it.
func flagBlocks(help string) []string {
	var out []string
	var cur []string
	flush := func() {
		if len(cur) > 0 {
			out = append(out, strings.Join(cur, "\n"))
		}
		cur = nil
	}
	for _, l := range strings.Split(help, "\n") {
		switch {
		case strings.HasPrefix(l, "  --"):
			flush()
			cur = []string{l}
		case len(cur) > 0 && strings.HasPrefix(l, "      "):
			cur = append(cur, l)
		default:
			flush()
		}
	}
	flush()
	return out
}
