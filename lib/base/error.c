/*
 * error.c — error codes and the per-thread error message.
 *
 * Messages live in a thread-local buffer so that any module can attach context to
 * the code it returns, and ckpt_last_error() reads it without locks. A worker
 * thread's failure travels to the waiting thread by copy (ckpt_err_restore).
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "ckpt_internal.h"

#define ERR_MSG_CAP 1024

static __thread char err_msg[ERR_MSG_CAP];

const char *ckpt_strerror(int err)
{
	switch (err) {
	case 0:               return "success";
	case CKPT_ECORRUPT:   return "stored data is corrupt (hash or structure check failed)";
	case CKPT_EFORMAT:    return "not a libckpt object, or malformed metadata";
	case CKPT_EVERSION:   return "written by a newer, unsupported format version";
	case CKPT_ENOTFOUND:  return "no such step, tensor or blob";
	case CKPT_EABORTED:   return "the save was aborted; the step is not visible";
	case CKPT_EINDOUBT:   return "coordinator lost after voting: outcome in doubt, the manifest decides";
	case CKPT_ENAME:      return "invalid tensor or blob name";
	case CKPT_ESHAPE:     return "bad shape or slice (outside the shape, or too large)";
	case CKPT_EDTYPE:     return "dtype differs from the stored one";
	case CKPT_ENOTROOT:   return "not a checkpoint root";
	case CKPT_ERANKBOUND: return "rank-bound item requested by a different rank or world size";
	case CKPT_EAUTH:      return "peer failed authentication";
	case CKPT_EPROTO:     return "malformed or unexpected protocol message";
	case CKPT_EPEER:      return "peer rejected the connection or the job";
	case CKPT_ESTATE:     return "operation not valid in the current state";
	case CKPT_EINVALID:   return "gathered checkpoint index failed validation";
	case CKPT_ENODEV:     return "requested transport, device or feature is not available";
	case CKPT_ENOMANIFEST: return "no usable manifest for the root here (a lost or damaged one: ckpt-inspect rebuild)";
	default:
		break;
	}
	if (err < 0 && err > -4096) {
		/* strerror is not thread-safe; the glibc table of sys errors is. */
		const char *s = strerrordesc_np(-err);
		if (s)
			return s;
	}
	return "unknown error";
}

static int err_vset(int code, bool prefix, const char *fmt, va_list ap)
{
	char tmp[ERR_MSG_CAP];
	int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
	if (n < 0)
		tmp[0] = '\0';
	if (prefix && err_msg[0]) {
		char old[ERR_MSG_CAP];
		memcpy(old, err_msg, sizeof old);
		snprintf(err_msg, sizeof err_msg, "%s: %s", tmp, old);
	} else {
		snprintf(err_msg, sizeof err_msg, "%s (%s)", tmp, ckpt_strerror(code));
	}
	return code;
}

int ckpt_err(int code, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	err_vset(code, false, fmt, ap);
	va_end(ap);
	return code;
}

int ckpt_err_prefix(int code, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	err_vset(code, true, fmt, ap);
	va_end(ap);
	return code;
}

const char *ckpt_err_msg(void) { return err_msg; }
void ckpt_err_clear(void) { err_msg[0] = '\0'; }

void ckpt_err_restore(const char *msg)
{
	if (msg != err_msg)
		snprintf(err_msg, sizeof err_msg, "%s", msg ? msg : "");
}

const char *ckpt_last_error()
{
	return err_msg;
}
