package main

import (
	"errors"
	"fmt"
	"os"
	"strings"
)

// tokenFlag is how a long-running command (the collector, the agent) takes
// its token: from the environment variable env or from a file
// (--token-file), never from the command line, where every user of the
// machine sees it in ps.
type tokenFlag struct {
	env  string
	file *string
}

// addTokenFlag defines --token-file (with its variable fileEnv) and a
// --token that is refused with what to do instead.
func addTokenFlag(f *envFlags, env, fileEnv, what string) tokenFlag {
	t := tokenFlag{env: env, file: f.String("token-file", fileEnv, "", "file holding the "+what+" sent as Authorization: Bearer; or set "+env)}
	msg := "a token on the command line is visible to every user of the machine (ps): set " + env + " or use --token-file"
	f.Func("token", "not taken: "+msg, func(string) error { return errors.New(msg) })
	return t
}

// value returns the token: the file's content, trimmed, when --token-file
// is given, else the variable's value.
func (t tokenFlag) value() (string, error) {
	if *t.file == "" {
		return os.Getenv(t.env), nil
	}
	b, err := os.ReadFile(*t.file)
	if err != nil {
		return "", fmt.Errorf("token-file: %w", err)
	}
	token := strings.TrimSpace(string(b))
	if token == "" {
		return "", fmt.Errorf("token-file: %s is empty", *t.file)
	}
	return token, nil
}
