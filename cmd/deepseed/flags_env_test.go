package main

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// Every flag of every command and subcommand that -h lists names its
// environment variable or says it has none: -h is the one place a user
// learns how to set it.
func TestEveryFlagSaysItsEnvironmentVariable(t *testing.T) {
	pages := helpPages(t)
	flags := 0
	for _, p := range pages {
		// helpFlags reports a flag whose last line neither names its
		// variable nor says it has none.
		flags += len(helpFlags(t, p))
	}
	if len(pages) < 15 || flags < 100 {
		t.Fatalf("walked %d commands and %d flags; the help's shape changed under this test", len(pages), flags)
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

// variablesOutsideHelp is every DEEPSEED_ variable the docs may name
// that no command's -h lists as a flag's, with what reads it. The docs
// and -h are checked against it: a variable in the docs is in some -h or
// here, so neither can drift from the program unseen.
var variablesOutsideHelp = map[string]string{
	"DEEPSEED_":                  "the prefix itself, in prose",
	"DEEPSEED_ATTACK_BODIES":     "the tests (the attack-body figures of cmd/deepseed)",
	"DEEPSEED_ALERT_WEBHOOK_URL": "Grafana's alert provisioning (grafana/provisioning/alerting)",
	"DEEPSEED_COMM":              "the hook",
	"DEEPSEED_FILE":              "the hook",
	"DEEPSEED_FLUSH_TIMEOUT":     "the hook",
	"DEEPSEED_HANG_S":            "the hook",
	"DEEPSEED_LAYER_EVERY":       "the hook",
	"DEEPSEED_MODE":              "the hook",
	"DEEPSEED_PARAMS":            "the agent sets it for a job; the hook reads it",
	"DEEPSEED_INGEST_TOKEN":      "a shell variable of docs/without-docker.md's steps, defined there",
	"DEEPSEED_SUBMIT_TOKEN":      "docker-compose's .env",
	"DEEPSEED_TEST_BULK_STEPS":   "the tests (the bulk-load check of query)",
	"DEEPSEED_TEST_DATABASE_URL": "the tests (store/storetest)",
	"DEEPSEED_TEST_NO_INSTALL":   "the tests",
	"DEEPSEED_TEST_NO_SLURM":     "the tests",
	"DEEPSEED_TEST_SLURM":        "the tests",
	"DEEPSEED_TEST_TIMESCALE":    "the tests",
}

// Every DEEPSEED_ variable that README.md and docs/ name is one that
// some command's -h names, or one of variablesOutsideHelp.
func TestDocumentedVariablesAreInHelp(t *testing.T) {
	var help strings.Builder
	for _, p := range helpPages(t) {
		help.WriteString(p.text)
	}
	inHelp := map[string]bool{}
	variable := regexp.MustCompile(`DEEPSEED_[A-Z0-9_]*`)
	for _, v := range variable.FindAllString(help.String(), -1) {
		inHelp[v] = true
	}
	docs, err := filepath.Glob("../../docs/*.md")
	if err != nil {
		t.Fatal(err)
	}
	for _, doc := range append(docs, "../../README.md") {
		b, err := os.ReadFile(doc)
		if err != nil {
			t.Fatal(err)
		}
		for _, v := range variable.FindAllString(string(b), -1) {
			if _, ok := variablesOutsideHelp[v]; !ok && !inHelp[v] {
				t.Errorf("%s names %s, which no command's -h names and variablesOutsideHelp does not list", filepath.Base(doc), v)
			}
		}
	}
	for v := range variablesOutsideHelp {
		if inHelp[v] {
			t.Errorf("%s is in variablesOutsideHelp but a command's -h names it: take it out of the table", v)
		}
	}
}
