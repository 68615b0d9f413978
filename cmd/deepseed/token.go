package main

import (
	"errors"
	"fmt"
	"net/http"
	"os"
	"strings"
)

// The one rule of every command that sends a token: it comes from an
// environment variable or from a file (--token-file), never from the
// command line, where every user of the machine sees it in ps. --token is
// refused by every command, without echoing its value.

// tokenKind is which token a command sends: what the user calls it, the
// variable the command reads it from, and the server's variable that
// lists the tokens it accepts.
type tokenKind struct {
	what, env, fileEnv, serverEnv string
}

var (
	ingestToken = tokenKind{"ingest token", "DEEPSEED_TOKEN", "DEEPSEED_TOKEN_FILE", "DEEPSEED_INGEST_TOKENS"}
	readToken   = tokenKind{"read token (an ingest token also reads)", "DEEPSEED_TOKEN", "DEEPSEED_TOKEN_FILE", "DEEPSEED_READ_TOKENS"}
	submitToken = tokenKind{"submit token", "DEEPSEED_TOKEN", "DEEPSEED_TOKEN_FILE", "DEEPSEED_SUBMIT_TOKENS"}
	agentToken  = tokenKind{"agent token", "DEEPSEED_AGENT_TOKEN", "DEEPSEED_AGENT_TOKEN_FILE", "DEEPSEED_AGENT_TOKENS"}
)

// tokenFlag is how a command takes its token: from the environment
// variable of its kind or from a file (--token-file).
type tokenFlag struct {
	kind     tokenKind
	fileFlag string
	file     *string
}

// addTokenFlag defines --token-file (with its variable) and a --token
// that is refused with what to do instead.
func addTokenFlag(f *envFlags, k tokenKind) tokenFlag {
	return addNamedTokenFlag(f, "token", k)
}

// addNamedTokenFlag is addTokenFlag for a command that sends more than
// one token: --NAME-file, and --NAME refused.
func addNamedTokenFlag(f *envFlags, name string, k tokenKind) tokenFlag {
	t := tokenFlag{kind: k, fileFlag: name + "-file"}
	t.file = f.String(t.fileFlag, k.fileEnv, "", "file holding the "+k.what+" sent as Authorization: Bearer; or set "+k.env)
	f.refuse(name, "a token on the command line is visible to every user of the machine (ps): set "+k.env+" or use --"+t.fileFlag)
	return t
}

// value returns the token: the file's content, trimmed, when --token-file
// is given, else the variable's value.
func (t tokenFlag) value() (string, error) {
	if *t.file == "" {
		return os.Getenv(t.kind.env), nil
	}
	b, err := os.ReadFile(*t.file)
	if err != nil {
		return "", fmt.Errorf("--%s: %w", t.fileFlag, err)
	}
	token := strings.TrimSpace(string(b))
	if token == "" {
		return "", fmt.Errorf("--%s: %s is empty", t.fileFlag, *t.file)
	}
	return token, nil
}

// source names where the token came from, never the token.
func (t tokenFlag) source() string {
	if *t.file != "" {
		return "--" + t.fileFlag + " " + *t.file
	}
	return t.kind.env
}

// howToSet is what a user does to give the token.
func (t tokenFlag) howToSet() string {
	return "set " + t.kind.env + " or use --" + t.fileFlag
}

// refused turns the server's 401 or 403 into one line naming the token,
// where it came from and what to do; other statuses give nil. sent says
// whether a token was sent; msg is the server's own words.
func (t tokenFlag) refused(server string, status int, sent bool, msg string) error {
	switch {
	case status == http.StatusUnauthorized && !sent:
		return fmt.Errorf("the server at %s wants a token and none was given: %s, with the %s that the server's %s lists (server: %s)",
			server, t.howToSet(), t.kind.what, t.kind.serverEnv, msg)
	case status == http.StatusUnauthorized:
		return fmt.Errorf("the server at %s refused the token from %s (%s): give the %s that the server's %s lists",
			server, t.source(), msg, t.kind.what, t.kind.serverEnv)
	case status == http.StatusForbidden:
		return fmt.Errorf("the server at %s refused the token from %s: %s", server, t.source(), msg)
	}
	return nil
}

// errNoToken is the refusal of a command that cannot work without a
// token, before it sends anything.
func (t tokenFlag) errNoToken(cmd string) error {
	return errors.New(cmd + ": no " + t.kind.what + ": " + t.howToSet() + ", with the token that the server's " + t.kind.serverEnv + " lists")
}
