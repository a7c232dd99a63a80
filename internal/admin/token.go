package admin

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
)

// TokenFileError is returned by ReadToken when the token file may be read by
// someone other than its owner.
type TokenFileError struct {
	Path string
	Mode fs.FileMode
}

func (e *TokenFileError) Error() string {
	return fmt.Sprintf("token file %s has mode %#o: it must not be readable or writable by group or others; run chmod 600 %s",
		e.Path, e.Mode.Perm(), e.Path)
}

// maxTokenFile bounds what ReadToken reads.
const maxTokenFile = 4096

// ErrEmptyToken is returned by ReadToken when the token file holds nothing
// but white space.
var ErrEmptyToken = errors.New("token file holds no token")

// ReadToken reads the bearer token from path (admin.token_file, or the
// CLI's --token-file): the file's content without surrounding white space
// (a trailing newline is the usual). It refuses a file that group or others
// may read or write.
func ReadToken(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("token file: %w", err)
	}
	defer f.Close()
	// The mode of the file opened, not of whatever the path names after a
	// rename in between.
	fi, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("token file: %w", err)
	}
	if !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("token file %s: not a regular file", path)
	}
	if fi.Mode().Perm()&0o077 != 0 {
		return nil, &TokenFileError{Path: path, Mode: fi.Mode()}
	}
	// A token file is small; a path to something else is not read whole.
	data, err := io.ReadAll(io.LimitReader(f, maxTokenFile+1))
	if err != nil {
		return nil, fmt.Errorf("token file %s: %w", path, err)
	}
	if len(data) > maxTokenFile {
		return nil, fmt.Errorf("token file %s: more than %d bytes: not a token", path, maxTokenFile)
	}
	tok := bytes.TrimSpace(data)
	if len(tok) == 0 {
		return nil, fmt.Errorf("%w: %s", ErrEmptyToken, path)
	}
	return tok, nil
}
