package console

import (
	"bytes"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"fmt"
	"os"
	"strings"
	"sync"
	"time"
	"unicode"

	"golang.org/x/crypto/bcrypt"
)

const (
	// htpasswdCheckInterval is how often, at most, the console looks at
	// whether its htpasswd file changed (on a sign-in, never in the
	// background).
	htpasswdCheckInterval = time.Second
	// htpasswdCacheTTL is how long a verified user and password are taken
	// without bcrypt again. A browser sends them with every request, and
	// bcrypt costs tens of milliseconds by design.
	htpasswdCacheTTL = 5 * time.Minute
	// maxHtpasswdSize is the largest htpasswd file the console reads.
	maxHtpasswdSize = 1 << 20
)

// htpasswdUser is one user of an htpasswd file.
type htpasswdUser struct {
	hash []byte
	role Role
}

// ReadHtpasswdFile reads the htpasswd file at path as Config's
// AuthConfig.HtpasswdFile is read, and returns its users and their roles,
// or the error New would return for it: the file, the line and what is
// wrong with it, never a hash.
func ReadHtpasswdFile(path string) (map[string]Role, error) {
	users, _, err := readHtpasswd(path)
	if err != nil {
		return nil, err
	}
	roles := make(map[string]Role, len(users))
	for name, u := range users {
		roles[name] = u.role
	}
	return roles, nil
}

// readHtpasswd reads and parses the htpasswd file at path, and returns its
// users and the file's info (to tell a later change).
func readHtpasswd(path string) (map[string]htpasswdUser, os.FileInfo, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, nil, err
	}
	defer func() { _ = f.Close() }() // read only: nothing to lose
	fi, err := f.Stat()
	if err != nil {
		return nil, nil, err
	}
	if fi.IsDir() {
		return nil, nil, fmt.Errorf("%s is a directory: want an htpasswd file", path)
	}
	if fi.Size() > maxHtpasswdSize {
		return nil, nil, fmt.Errorf("%s has %d bytes: at most %d", path, fi.Size(), maxHtpasswdSize)
	}
	data := make([]byte, fi.Size())
	if _, err := f.ReadAt(data, 0); err != nil && fi.Size() > 0 {
		return nil, nil, fmt.Errorf("read %s: %w", path, err)
	}
	users, err := parseHtpasswd(path, data)
	if err != nil {
		return nil, nil, err
	}
	return users, fi, nil
}

// parseHtpasswd parses the lines of an htpasswd file (named name in
// errors): "user:hash" or "user:hash:role", the hash bcrypt's, the role
// viewer (when left out) or operator; blank lines and lines starting with
// "#" are skipped. An error names the line and never quotes the hash.
func parseHtpasswd(name string, data []byte) (map[string]htpasswdUser, error) {
	users := map[string]htpasswdUser{}
	lineOf := map[string]int{}
	for i, line := range strings.Split(string(data), "\n") {
		n := i + 1
		line = strings.TrimSpace(strings.TrimSuffix(line, "\r"))
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		fields := strings.Split(line, ":")
		if len(fields) < 2 || len(fields) > 3 {
			return nil, fmt.Errorf("%s:%d: want user:bcrypt-hash or user:bcrypt-hash:role", name, n)
		}
		user, hash := fields[0], []byte(fields[1])
		switch {
		case user == "":
			return nil, fmt.Errorf("%s:%d: the user is empty: want user:bcrypt-hash[:role]", name, n)
		case strings.HasPrefix(user, "$"):
			// A hash where the user should be: say so without quoting it.
			return nil, fmt.Errorf("%s:%d: the line starts with a hash: want user:bcrypt-hash[:role]", name, n)
		case len(user) > maxName || strings.ContainsFunc(user, func(r rune) bool { return unicode.IsSpace(r) || unicode.IsControl(r) }):
			return nil, fmt.Errorf("%s:%d: the user has spaces or control characters, or more than %d bytes", name, n, maxName)
		}
		if !isBcrypt(hash) {
			return nil, fmt.Errorf("%s:%d: user %s: the hash is not bcrypt's (want $2y$, $2b$ or $2a$ and 60 characters, as `htpasswd -nB %s` prints; MD5, SHA and crypt hashes are refused)", name, n, user, user)
		}
		role := RoleViewer
		if len(fields) == 3 {
			r, err := ParseRole(fields[2])
			if err != nil {
				return nil, fmt.Errorf("%s:%d: user %s: %w", name, n, user, err)
			}
			role = r
		}
		if first, dup := lineOf[user]; dup {
			return nil, fmt.Errorf("%s:%d: user %s again (first on line %d)", name, n, user, first)
		}
		lineOf[user] = n
		users[user] = htpasswdUser{hash: hash, role: role}
	}
	if len(users) == 0 {
		return nil, fmt.Errorf("%s: no user in it: want lines user:bcrypt-hash[:role]", name)
	}
	return users, nil
}

// isBcrypt reports whether hash is a bcrypt hash that bcrypt can compare.
func isBcrypt(hash []byte) bool {
	if len(hash) != 60 {
		return false
	}
	switch string(hash[:4]) {
	case "$2a$", "$2b$", "$2y$":
	default:
		return false
	}
	_, err := bcrypt.Cost(hash)
	return err == nil
}

// htpasswd is the users of an htpasswd file, read again when it changes,
// with the sign-ins verified lately. It is safe for concurrent use.
type htpasswd struct {
	path string
	// key keys the cache's password MACs (random per process).
	key []byte
	// compare is bcrypt.CompareHashAndPassword (a test counts its calls).
	compare func(hash, password []byte) error

	mu      sync.Mutex
	users   map[string]htpasswdUser
	dummy   []byte      // a hash of the users' cost, for unknown users
	file    os.FileInfo // the file as last read or seen
	checked time.Time   // when the file was last looked at
	cache   map[string]verified
}

// verified is a sign-in verified with bcrypt: the MAC of the password, the
// hash it matched and until when it is taken without bcrypt.
type verified struct {
	mac   []byte
	hash  []byte
	until time.Time
}

// reloadEvent is what a look at the file found: the number of users of a
// changed file read again, or why it could not be.
type reloadEvent struct {
	users int
	err   error
}

// loadHtpasswd reads the htpasswd file at path.
func loadHtpasswd(path string) (*htpasswd, error) {
	users, fi, err := readHtpasswd(path)
	if err != nil {
		return nil, err
	}
	h := &htpasswd{path: path, key: make([]byte, 32), compare: bcrypt.CompareHashAndPassword, cache: map[string]verified{}}
	if _, err := rand.Read(h.key); err != nil {
		return nil, fmt.Errorf("generate the sign-in cache's key: %w", err)
	}
	if err := h.set(users, fi); err != nil {
		return nil, err
	}
	h.checked = time.Now()
	return h, nil
}

// set makes users the current ones (h.mu held, or h not shared yet).
func (h *htpasswd) set(users map[string]htpasswdUser, fi os.FileInfo) error {
	cost := bcrypt.MinCost
	for _, u := range users {
		if c, err := bcrypt.Cost(u.hash); err == nil && c > cost {
			cost = c
		}
	}
	if c, err := bcrypt.Cost(h.dummy); err != nil || c != cost {
		// An unknown user costs one bcrypt of the same cost as a known one.
		secret := make([]byte, 32)
		if _, err := rand.Read(secret); err != nil {
			return fmt.Errorf("generate the unknown users' hash: %w", err)
		}
		dummy, err := bcrypt.GenerateFromPassword(secret, cost)
		if err != nil {
			return fmt.Errorf("generate the unknown users' hash: %w", err)
		}
		h.dummy = dummy
	}
	h.users, h.file = users, fi
	clear(h.cache)
	return nil
}

// authenticate reports whether user signs in with password, and their
// role; it first reads the file again when it changed. An unknown user
// costs a bcrypt comparison as a known one does.
func (h *htpasswd) authenticate(user, password string) (Role, bool, reloadEvent) {
	ev := h.refresh()
	mac := h.mac(user, password)
	h.mu.Lock()
	u, known := h.users[user]
	dummy := h.dummy
	hit := false
	if v, ok := h.cache[user]; ok && known && time.Now().Before(v.until) && bytes.Equal(v.hash, u.hash) && hmac.Equal(v.mac, mac) {
		hit = true
	}
	h.mu.Unlock()
	if hit {
		return u.role, true, ev
	}
	if !known {
		_ = h.compare(dummy, []byte(password))
		return "", false, ev
	}
	if h.compare(u.hash, []byte(password)) != nil {
		return "", false, ev
	}
	h.mu.Lock()
	if cur, ok := h.users[user]; ok && bytes.Equal(cur.hash, u.hash) {
		h.cache[user] = verified{mac: mac, hash: u.hash, until: time.Now().Add(htpasswdCacheTTL)}
	}
	h.mu.Unlock()
	return u.role, true, ev
}

// mac is the MAC of a user's password under the process's key: what the
// cache keeps instead of the password.
func (h *htpasswd) mac(user, password string) []byte {
	m := hmac.New(sha256.New, h.key)
	m.Write([]byte(user))
	m.Write([]byte{0})
	m.Write([]byte(password))
	return m.Sum(nil)
}

// refresh reads the file again when it changed since it was last looked
// at, at most once every htpasswdCheckInterval. A file that cannot be read
// or parsed leaves the users as they were; its error is reported once per
// change.
func (h *htpasswd) refresh() reloadEvent {
	h.mu.Lock()
	defer h.mu.Unlock()
	now := time.Now()
	if now.Sub(h.checked) < htpasswdCheckInterval {
		return reloadEvent{}
	}
	h.checked = now
	fi, err := os.Stat(h.path)
	if err != nil {
		if h.file == nil {
			return reloadEvent{} // reported already
		}
		h.file = nil
		return reloadEvent{err: err}
	}
	if h.file != nil && os.SameFile(fi, h.file) && fi.ModTime().Equal(h.file.ModTime()) && fi.Size() == h.file.Size() {
		return reloadEvent{}
	}
	users, read, err := readHtpasswd(h.path)
	if err != nil {
		h.file = fi // do not report it again until the file changes
		return reloadEvent{err: err}
	}
	if err := h.set(users, read); err != nil {
		return reloadEvent{err: err}
	}
	return reloadEvent{users: len(users)}
}
